"""The GRPO policy loss: PPO clip-higher, reduced per attempt so a fanned-out attempt weighs as one."""

from __future__ import annotations

import torch
from torch import Tensor


def policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor,
                attempt_index: Tensor, *, eps_clip: float = 0.2, eps_clip_high: float = 0.28,
                ref_logprobs: Tensor | None = None, kl_coef: float = 0.0, tis_cap: float | None = None,
                rollout_logprobs: Tensor | None = None, attempt_token_counts: Tensor | None = None,
                num_attempts: int | Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of one packed micro-batch, and its metrics as detached 0-d tensors.

    Every tensor is flat over the micro-batch's response tokens: `logprobs` (the trained policy's, with
    grad), `old_logprobs` (the behaviour policy's), `advantages` (each token's sample advantage),
    `loss_mask` (1 on sampled tokens, the only ones that count) and `attempt_index`, the step-local id of
    each token's attempt. In this project the behaviour policy is the sampler: old_logprobs are SGLang's
    rollout log-probs unless the trainer recomputes them.

    Per token, l = -min(r A, clip(r, 1 - eps_clip, 1 + eps_clip_high) A) with r = exp(logprobs -
    old_logprobs). The reduction weighs attempts, not tokens or samples, so an attempt whose trajectory
    fanned out into several samples still weighs as one:

        loss = sum_t mask_t l_t / attempt_token_counts[attempt_t] / num_attempts

    where attempt_token_counts[a] is attempt a's masked tokens in the whole step and num_attempts the
    step's attempts. With those step figures, the losses (and metrics) of a step's micro-batches add up
    to the step's: backward each micro-batch loss and accumulate, with no further division. Left out,
    they default to this micro-batch's own (attempts with a masked token here), which is exact only when
    the micro-batch is the step: an attempt split over micro-batches would otherwise count once in each.
    Data-parallel all-reduce averages gradients over ranks, so there scale the loss by dp_size. Counts
    are not checked against the tokens, which would cost a device sync per micro-batch.

    With `ref_logprobs`, kl_coef times the k3 estimate of KL(policy || reference), exp(ref - lp) -
    (ref - lp) - 1, joins l. With `tis_cap` and `rollout_logprobs`, truncated importance sampling
    multiplies the policy-gradient term (not the KL penalty, a regulariser) by the detached
    min(exp(old_logprobs - rollout_logprobs), tis_cap), correcting for a trainer-recomputed behaviour
    policy that differs from the sampler's.

    Metrics, reduced like the loss: pg_loss, clipfrac (tokens where clipping bound), approx_kl (k3 of
    the behaviour policy against the current one), ratio; kl with a reference; tis with TIS.
    """
    _check(logprobs, old_logprobs, advantages, loss_mask, attempt_index, ref_logprobs, rollout_logprobs)
    if not (0 < eps_clip < 1 and eps_clip_high > 0):
        raise ValueError(f"need 0 < eps_clip < 1 and eps_clip_high > 0, got {eps_clip} and {eps_clip_high}")
    if kl_coef and ref_logprobs is None:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logprobs")
    if (tis_cap is None) != (rollout_logprobs is None):
        raise ValueError("truncated importance sampling needs both tis_cap and rollout_logprobs")
    if tis_cap is not None and tis_cap <= 0:
        raise ValueError(f"tis_cap must be positive, got {tis_cap}")

    counted = loss_mask.bool()
    mask = counted.to(logprobs.dtype)
    if attempt_token_counts is None:
        attempt_token_counts = torch.bincount(attempt_index, weights=mask)
    if num_attempts is None:
        num_attempts = (attempt_token_counts > 0).sum()
    weight = mask / attempt_token_counts[attempt_index].to(logprobs.dtype).clamp(min=1)
    weight = weight / torch.as_tensor(num_attempts, dtype=logprobs.dtype, device=logprobs.device).clamp(min=1)

    def reduce(per_token: Tensor) -> Tensor:
        # where, not a product: padding log-probs may be -inf, and inf * 0 would poison loss and grad
        return torch.where(counted, per_token * weight, 0.0).sum()

    log_ratio = torch.where(counted, logprobs - old_logprobs, 0.0)
    ratio = log_ratio.exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages
    pg = -torch.minimum(unclipped, clipped)
    metrics: dict[str, Tensor] = {}
    if tis_cap is not None and rollout_logprobs is not None:     # both or neither: checked above
        tis = torch.where(counted, old_logprobs - rollout_logprobs, 0.0).exp().clamp(max=tis_cap).detach()
        pg = pg * tis
        metrics["tis"] = reduce(tis)
    loss = reduce(pg)
    metrics["pg_loss"] = loss.detach()
    if ref_logprobs is not None:
        ref_gap = torch.where(counted, ref_logprobs - logprobs, 0.0)
        kl = reduce(ref_gap.exp() - ref_gap - 1)
        loss = loss + kl_coef * kl
        metrics["kl"] = kl.detach()
    with torch.no_grad():
        metrics["clipfrac"] = reduce((clipped < unclipped).to(logprobs.dtype))
        metrics["approx_kl"] = reduce(ratio - 1 - log_ratio)
        metrics["ratio"] = reduce(ratio)
    return loss, {name: value.detach() for name, value in metrics.items()}


def _check(logprobs: Tensor, *per_token: Tensor | None) -> None:
    if logprobs.dim() != 1:
        raise ValueError(f"logprobs must be flat over the micro-batch's response tokens, got shape "
                         f"{tuple(logprobs.shape)}")
    names = ("old_logprobs", "advantages", "loss_mask", "attempt_index", "ref_logprobs", "rollout_logprobs")
    for name, tensor in zip(names, per_token, strict=True):
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, logprobs {tuple(logprobs.shape)}: "
                             f"every input needs one entry per token")
