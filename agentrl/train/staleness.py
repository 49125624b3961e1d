"""Bounded staleness: which of a rollout's trained tokens are too old to train on (pure, numpy).

With `train.max_staleness` k > 0 the trainer keeps k rollouts open ahead of the one it trains, so a
rollout's tokens may come from weights some rollouts behind the policy that trains on them. A token's
lag is the policy's version (the rollouts it has trained on) less the weight version of the model that
generated it (`Sample.token_versions`). The synchronous loop's lag is 0 with `publish_every` 1, and up
to `publish_every` - 1 in general (servers keep a version for that many rollouts); rollouts ahead add
up to k. So the bound is k + publish_every - 1, and what lags more is taken out of the loss: its tokens
are masked, and a sample left with no trained token is dropped. The advantages are computed before
(agentrl.train.batch), over every attempt of the group, so a masked turn changes no other attempt's
advantage: the group's baseline stays that of its whole outcome.

A token whose version is unknown (a server that reports none) cannot be shown to be within the
bound: with k > 0 it is masked too; at k = 0 the loop's order (publish, then open) bounds it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..sample import UNKNOWN_VERSION
from .batch import RolloutBatch


def staleness_bound(max_staleness: int, publish_every: int) -> int:
    """The largest lag (in rollouts trained) that a trained token may have."""
    return max_staleness + publish_every - 1


@dataclass(frozen=True)
class StalenessReport:
    lags: Counter[int]          # trained tokens by lag, before the bound (unknown versions apart)
    unversioned_tokens: int     # trained tokens whose weight version is unknown
    masked_tokens: int          # trained tokens taken out of the loss: past the bound
    dropped_samples: int        # samples left with no trained token

    def metrics(self) -> dict[str, Any]:
        """The step's staleness, for metrics.jsonl: the lag's distribution over trained tokens, what was cut."""
        known = sum(self.lags.values())
        out: dict[str, Any] = {
            "staleness/max": max(self.lags, default=0),
            "staleness/mean": round(sum(lag * n for lag, n in self.lags.items()) / known, 4) if known else 0.0,
            "staleness/unversioned_tokens": self.unversioned_tokens,
            "staleness/masked_tokens": self.masked_tokens,
            "staleness/dropped_samples": self.dropped_samples,
        }
        out.update({f"staleness/tokens_lag_{lag}": n for lag, n in sorted(self.lags.items())})
        return out


def bound_staleness(batch: RolloutBatch, *, policy_version: int, bound: int,
                    mask_unknown: bool) -> tuple[RolloutBatch, StalenessReport]:
    """The batch with every trained token that lags more than `bound` masked, and samples left with none
    dropped; what it found. `mask_unknown`: whether tokens of unknown version count as past the bound."""
    lags: Counter[int] = Counter()
    unversioned = masked = 0
    samples, keep = list(batch.samples), []
    for i, s in enumerate(batch.samples):
        trained = s.loss_mask.astype(bool)
        unknown = trained & (s.token_versions == UNKNOWN_VERSION)
        known = trained & ~unknown
        lag = policy_version - s.token_versions.astype(np.int64)
        lags.update(lag[known].tolist())
        unversioned += int(unknown.sum())
        stale = known & (lag > bound)
        if mask_unknown:
            stale |= unknown
        if stale.any():
            masked += int(stale.sum())
            samples[i] = replace(s, loss_mask=np.where(stale, 0, s.loss_mask).astype(np.uint8))
            if not samples[i].loss_mask.any():
                continue
        keep.append(i)
    report = StalenessReport(lags, unversioned, masked, len(samples) - len(keep))
    if not masked:
        return batch, report
    return RolloutBatch([samples[i] for i in keep], batch.advantages[keep],
                        [batch.attempt[i] for i in keep]), report
