"""How far the trainer's log-probs are from the sampler's, on the tokens an optimizer step trains (pure).

The sampler (SGLang, or the CPU stand-in) and the trainer compute the same model with different
kernels, batch shapes and precisions; in a mixture of experts a tiny difference can also route a token
to other experts. Then the trainer differentiates another function than the one that sampled, and the
importance ratio of that token means nothing; the only symptom is a run that stops learning. So every
step measures it, from the log-probs the loss computes anyway (no extra forward):

- mean and max of |log p_train - log p_rollout| over the trained tokens;
- the k3 estimate of KL(rollout || train): the tokens were drawn from the rollout's distribution, so
  with log r = log p_train - log p_rollout, the mean of exp(log r) - 1 - log r estimates it, and is >= 0;
- the share of tokens whose |difference| passes OVER.

Measured where the two compute the same function: on the tokens the policy's own weights sampled (their
token_versions the policy's version), on a rollout's first optimizer step, before the policy moves
(StepPlan.mismatch_version, which the loop sets). Any difference there is the sampler's and the trainer's
alone. With the defaults (max_staleness 0, publish_every 1, global_batch_size None: one step a rollout)
that is every step and every trained token; a rollout's later steps, and tokens of older weights, would
add the policy's own moves (approx_kl and staleness/* measure those) and are left out: mismatch_tokens
says how many were measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:       # torch only where a forward's tensors come in: the report reads OVER without it
    from torch import Tensor

OVER = 0.5      # a token whose |log p_train - log p_rollout| passes this counts in mismatch_over
# A step's raw figures as its metrics carry them until the ranks are reduced: summed, except MAX_KEY.
RAW_KEYS = ("mismatch_tokens", "mismatch_abs_sum", "mismatch_k3_sum", "mismatch_over_count", "mismatch_max")
MAX_KEY = "mismatch_max"


@dataclass(frozen=True)
class Mismatch:
    tokens: int = 0
    abs_sum: float = 0.0
    k3_sum: float = 0.0
    over_count: int = 0
    max_abs: float = 0.0

    @classmethod
    def of(cls, train_logprobs: Tensor, rollout_logprobs: Tensor, loss_mask: Tensor) -> Mismatch:
        """Over the tokens where loss_mask is set (flat tensors of one micro-batch)."""
        counted = loss_mask.bool()
        if not bool(counted.any()):
            return cls()
        log_ratio = (train_logprobs.detach().double() - rollout_logprobs.double())[counted]
        gap = log_ratio.abs()
        k3 = log_ratio.expm1() - log_ratio
        return cls(tokens=int(counted.sum()), abs_sum=float(gap.sum()), k3_sum=float(k3.sum()),
                   over_count=int((gap > OVER).sum()), max_abs=float(gap.max()))

    def __add__(self, other: Mismatch) -> Mismatch:
        return Mismatch(self.tokens + other.tokens, self.abs_sum + other.abs_sum, self.k3_sum + other.k3_sum,
                        self.over_count + other.over_count, max(self.max_abs, other.max_abs))

    def raw(self) -> dict[str, float]:
        """The figures to reduce over ranks (RAW_KEYS: summed, MAX_KEY by max), then read with from_raw."""
        return dict(zip(RAW_KEYS, (self.tokens, self.abs_sum, self.k3_sum, self.over_count, self.max_abs),
                        strict=True))

    @classmethod
    def from_raw(cls, raw: Mapping[str, float]) -> Mismatch:
        return cls(int(raw["mismatch_tokens"]), raw["mismatch_abs_sum"], raw["mismatch_k3_sum"],
                   int(raw["mismatch_over_count"]), raw["mismatch_max"])

    def metrics(self) -> dict[str, float]:
        """The step's figures: mismatch_mean, mismatch_max, mismatch_k3, mismatch_over (a share), and
        mismatch_tokens; none but the count when no token was trained."""
        if not self.tokens:
            return {"mismatch_tokens": 0}
        return {"mismatch_mean": self.abs_sum / self.tokens, "mismatch_max": self.max_abs,
                "mismatch_k3": self.k3_sum / self.tokens, "mismatch_over": self.over_count / self.tokens,
                "mismatch_tokens": self.tokens}


def finish_step(totals: Mapping[str, float]) -> dict[str, float]:
    """A step's metrics, reduced over ranks, with the raw mismatch figures turned into the step's own."""
    out = {k: v for k, v in totals.items() if k not in RAW_KEYS}
    return {**out, **Mismatch.from_raw(totals).metrics()} if RAW_KEYS[0] in totals else out


def rollout_metrics(steps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """A rollout's train/ figures from its steps': each the mean over the steps that have it, the
    worst token's difference the max, and mismatch_tokens the sum."""
    names = sorted({k for m in steps for k in m})
    out = {}
    for name in names:
        values = [m[name] for m in steps if name in m]
        out[name] = max(values) if name == MAX_KEY else sum(values) if name == "mismatch_tokens" \
            else sum(values) / len(values)
    return out


def warning(step_metrics: Mapping[str, float], threshold: float | None) -> str | None:
    """What to warn of when a step's mean difference passes `threshold` (train.mismatch_warn), else None."""
    mean = step_metrics.get("mismatch_mean")
    if threshold is None or mean is None or mean <= threshold:
        return None
    return (f"the sampler and the trainer disagree: mean |log p_train - log p_rollout| {mean:.4g} over "
            f"{int(step_metrics['mismatch_tokens'])} trained tokens (max {step_metrics['mismatch_max']:.4g}, "
            f"k3 KL {step_metrics['mismatch_k3']:.4g}, {100 * step_metrics['mismatch_over']:.2f}% past {OVER}) "
            f"passes train.mismatch_warn {threshold}: check that the servers run the weights and dtype the "
            f"trainer does (docs/train.md, \"Sampler and trainer\")")
