"""A rollout's samples as training data: advantages, steps, each rank's micro-batches (pure, numpy).

Every rank reads the same committed shards and computes the same plan, so ranks agree on steps and
per-attempt token counts without talking; each then trains only its own micro-batches.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..sample import Sample
from .advantages import grpo_advantages
from .schedule import assign_ranks, build_steps


@dataclass(frozen=True)
class RolloutBatch:
    samples: list[Sample]
    advantages: np.ndarray          # per sample
    attempt: list[tuple[int, int]]  # per sample: (group, attempt)

    @property
    def lengths(self) -> list[int]:
        return [len(s.tokens) for s in self.samples]


@dataclass(frozen=True)
class StepPlan:
    micro_batches: list[list[int]]         # this rank's, sample indices into the rollout batch
    attempt_index: dict[tuple[int, int], int]   # the step's attempts -> 0..n-1
    attempt_token_counts: np.ndarray       # per step attempt: its trained tokens in the whole step
    samples: int
    tokens: int                            # the step's tokens, all ranks
    # The weight version whose tokens measure the sampler/trainer mismatch (agentrl/train/mismatch.py): the
    # policy's own, on the first step of a rollout (the loop sets it); None: the policy has moved since.
    mismatch_version: int | None = None


def rollout_batch(groups: Mapping[int, Sequence[Sample]], *, std_normalize: bool = True) -> RolloutBatch:
    """The samples of the complete groups, in (group, attempt) order, with GRPO advantages."""
    samples = [s for g in sorted(groups) for s in sorted(groups[g], key=lambda s: s.attempt)]
    if not samples:
        raise ValueError(f"the rollout has no samples: {len(groups)} complete groups, none with a sample "
                         "(no group completed, or every attempt ended before its agent called the model)")
    attempt = [(s.group_index, s.attempt) for s in samples]
    adv = grpo_advantages([s.reward for s in samples], [s.group_index for s in samples],
                          [s.attempt for s in samples], std_normalize=std_normalize)
    return RolloutBatch(samples, adv, attempt)


def shuffle_rewards(groups: Mapping[int, Sequence[Sample]], seed: str) -> dict[int, list[Sample]]:
    """The control run's rollout: in each group the attempts' rewards are dealt out again at random.

    Everything but which attempt got which reward stays: the groups, their reward mean and spread,
    the compute. So a control run's policy moves as much as the real run's but the verifier no longer
    says which attempt was right, and what it learns is what the reward did not teach. A pure function
    of the groups and `seed` (the run's seed and the rollout), so a resumed run deals the same way.
    """
    out = {}
    for g, samples in groups.items():
        attempts = sorted({s.attempt: s.reward for s in samples}.items())
        rewards = [r for _, r in attempts]
        random.Random(f"{seed}/{g}").shuffle(rewards)
        dealt = {a: r for (a, _), r in zip(attempts, rewards, strict=True)}
        out[g] = [replace(s, reward=dealt[s.attempt]) for s in samples]
    return out


def plan_steps(batch: RolloutBatch, *, global_batch_size: int | None, max_tokens_per_gpu: int, dp_size: int,
               rank: int) -> list[StepPlan]:
    """The optimizer steps of a rollout, each with this rank's micro-batches."""
    attempts = len(set(batch.attempt))
    steps = build_steps(batch.lengths, batch.attempt, max_tokens_per_gpu=max_tokens_per_gpu, dp_size=dp_size,
                        global_batch_size=global_batch_size or attempts)
    plans = []
    for micro_batches in steps:
        members = sorted({i for mb in micro_batches for i in mb})
        index = {a: k for k, a in enumerate(sorted({batch.attempt[i] for i in members}))}
        counts = np.zeros(len(index))
        for i in members:
            counts[index[batch.attempt[i]]] += int(batch.samples[i].loss_mask.sum())
        mine = assign_ranks(micro_batches, batch.lengths, dp_size=dp_size)[rank]
        plans.append(StepPlan(mine, index, counts, len(members), sum(batch.lengths[i] for i in members)))
    return plans
