"""A micro-batch as tensors, the same for every backend (pure: numpy in, CPU tensors out)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from hpc.inference.routing import NO_ROUTE

from .batch import RolloutBatch, StepPlan


def padded_tokens(batch: RolloutBatch, indices: list[int]) -> Tensor:
    """The micro-batch's token ids, right-padded with 0 into [samples, longest]."""
    samples = [batch.samples[i] for i in indices]
    ids = torch.zeros(len(samples), max(len(s.tokens) for s in samples), dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, :len(s.tokens)] = torch.from_numpy(s.tokens.astype(np.int64))
    return ids


def padded_routes(batch: RolloutBatch, indices: list[int]) -> Tensor | None:
    """The micro-batch's recorded MoE routes over the forward's flattened [samples x longest] positions
    (NO_ROUTE in padding and where a sample has none), or None when no sample of it has any."""
    samples = [batch.samples[i] for i in indices]
    widths = {s.routed_experts.shape[1] for s in samples if s.routed_experts is not None}
    if not widths:
        return None
    if len(widths) > 1:
        raise ValueError(f"the micro-batch's samples carry routes of different widths {sorted(widths)}")
    longest = max(len(s.tokens) for s in samples)
    routes = torch.full((len(samples), longest, widths.pop()), NO_ROUTE, dtype=torch.long)
    for row, s in enumerate(samples):
        if s.routed_experts is not None:
            routes[row, :len(s.tokens)] = torch.from_numpy(s.routed_experts.astype(np.int64))
    return routes.flatten(0, 1)


def response_slices(per_position: Tensor, batch: RolloutBatch, indices: list[int], first: int = 0) -> Tensor:
    """Each sample's response entries of a [samples, positions] tensor over the next-token predictions,
    whose column 0 is position `first` (first_predictor)."""
    pieces = []
    for row, i in enumerate(indices):
        s = batch.samples[i]
        start = len(s.tokens) - s.response_length      # token t is predicted at position t - 1
        pieces.append(per_position[row, start - 1 - first:len(s.tokens) - 1 - first])
    return torch.cat(pieces)


def first_predictor(batch: RolloutBatch, indices: list[int]) -> int:
    """The first position whose prediction is a response token, over the micro-batch: the positions
    before it (every sample's prompt, most of its tokens) need no logits."""
    return min(len(batch.samples[i].tokens) - batch.samples[i].response_length for i in indices) - 1


def token_inputs(batch: RolloutBatch, plan: StepPlan, indices: list[int]) -> dict[str, Tensor]:
    """policy_loss's per-token inputs, flat over the micro-batch's response tokens (on the CPU)."""
    samples = [batch.samples[i] for i in indices]
    return {
        "advantages": torch.from_numpy(np.concatenate([np.full(s.response_length, batch.advantages[i], np.float32)
                                                       for i, s in zip(indices, samples, strict=True)])),
        "loss_mask": torch.from_numpy(np.concatenate([s.loss_mask.astype(np.float32) for s in samples])),
        "rollout": torch.from_numpy(np.concatenate([s.rollout_log_probs.astype(np.float32) for s in samples])),
        "versions": torch.from_numpy(np.concatenate([s.token_versions.astype(np.int64) for s in samples])),
        "attempt": torch.from_numpy(np.concatenate([np.full(s.response_length, plan.attempt_index[batch.attempt[i]],
                                                            np.int64) for i, s in zip(indices, samples, strict=True)])),
    }
