"""One GRPO optimizer step's micro-batch loop, the same for every backend: each supplies its forward.

Per micro-batch of the step plan: the behaviour policy's log-probs (with tis_cap: the trainer's own,
weighed against the sampler's) and the reference model's (with kl_coef), both without gradients; then
the policy's, the loss (agentrl.train.loss.policy_loss: the per-attempt reduction already divides by
the step) and its backward; and how far the policy's log-probs are from the sampler's
(agentrl.train.mismatch), from the same forward. The backend says how a micro-batch is computed
(`logprobs`), how its backward joins the others (`accumulating`: DDP's no_sync on every micro-batch but
the last) and how the loss is scaled for its gradient reduction (DDP averages over ranks: scale by the
world size).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .batch import RolloutBatch, StepPlan
from .config import TrainConfig
from .loss import policy_loss
from .mismatch import MAX_KEY, Mismatch, finish_step
from .tensors import token_inputs

LogProbs = Callable[[torch.nn.Module, list[int]], Tensor]     # (model, the micro-batch's samples) -> flat log-probs


def grpo_micro_batches(batch: RolloutBatch, plan: StepPlan, cfg: TrainConfig, device: torch.device | str, *,
                       logprobs: LogProbs, policy: torch.nn.Module, behaviour: torch.nn.Module,
                       ref: torch.nn.Module | None, loss_scale: float = 1.0,
                       accumulating: Callable[[bool], AbstractContextManager] = lambda last: nullcontext()
                       ) -> dict[str, float]:
    """Forward and backward over every micro-batch of `plan` (gradients accumulate in `policy`); the loss
    and metrics summed over them, on this rank. The caller zeroes the gradients before and steps after."""
    counts = torch.from_numpy(plan.attempt_token_counts).to(device, torch.float32)
    totals: dict[str, float] = {}
    mismatch = Mismatch()
    for k, indices in enumerate(plan.micro_batches):
        flat = {name: v.to(device) for name, v in token_inputs(batch, plan, indices).items()}
        old = flat["rollout"]
        if cfg.tis_cap is not None:      # the trainer's own behaviour policy, weighed against the sampler's
            with torch.no_grad():
                old = logprobs(behaviour, indices).float()
        ref_logprobs = None
        if ref is not None:
            with torch.no_grad():
                ref_logprobs = logprobs(ref, indices).float()
        with accumulating(k == len(plan.micro_batches) - 1):
            current = logprobs(policy, indices).float()
            if plan.mismatch_version is not None:     # the tokens these very weights sampled
                sampled_here = flat["loss_mask"].bool() & (flat["versions"] == plan.mismatch_version)
                mismatch = mismatch + Mismatch.of(current, flat["rollout"], sampled_here)
            loss, metrics = policy_loss(
                current, old, flat["advantages"], flat["loss_mask"], flat["attempt"],
                eps_clip=cfg.eps_clip, eps_clip_high=cfg.eps_clip_high, ref_logprobs=ref_logprobs,
                kl_coef=cfg.kl_coef, tis_cap=cfg.tis_cap,
                rollout_logprobs=flat["rollout"] if cfg.tis_cap is not None else None,
                attempt_token_counts=counts, num_attempts=len(plan.attempt_index))
            (loss * loss_scale).backward()
        for name, value in {"loss": loss.detach(), **metrics}.items():
            totals[name] = totals.get(name, 0.0) + float(value)
    return {**totals, **(mismatch.raw() if plan.mismatch_version is not None else {})}


def reduce_over_ranks(totals: dict[str, float], *, device: torch.device | str, group: Any = None) -> dict[str, float]:
    """A step's metrics from every data-parallel rank's grpo_micro_batches totals: summed, the worst
    token's mismatch by max (a collective over `group`, the default group when None); then the step's
    mismatch figures (agentrl.train.mismatch.finish_step)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1 and totals:
        names = sorted(k for k in totals if k != MAX_KEY)
        summed = torch.tensor([totals[n] for n in names], dtype=torch.float64, device=device)
        dist.all_reduce(summed, group=group)
        reduced = dict(zip(names, summed.tolist(), strict=True))
        if MAX_KEY in totals:
            worst = torch.tensor([totals[MAX_KEY]], dtype=torch.float64, device=device)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
            reduced[MAX_KEY] = float(worst.item())
        totals = reduced
    return finish_step(totals)
