"""GRPO advantages: rewards normalised within each prompt group, over attempts rather than samples."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def grpo_advantages(rewards: Sequence[float] | np.ndarray, group_index: Sequence[int] | np.ndarray,
                    attempt_ids: Sequence[Hashable], *, std_normalize: bool = True, eps: float = 1e-6) -> np.ndarray:
    """One advantage per sample (float64): its attempt's reward, centred on the group's attempt mean.

    `rewards`, `group_index` and `attempt_ids` hold one entry per sample. An attempt is keyed by
    (group, attempt id), so attempt ids may repeat across groups; its samples (the chains its trajectory
    tree fanned out into) must share one reward. Each attempt counts once for its group's mean and std,
    however many samples it has, and its advantage is broadcast back to all of them: weighting attempts
    by fan-out would drag the mean toward whichever attempt branched most and can flip other attempts'
    signs.

    With `std_normalize`, the centred reward is divided by the group's population std over attempts plus
    `eps`; without it (Dr.GRPO) it is left as is. A group whose attempts all share one reward gets
    exactly 0: it carries no signal, and its float mean need not equal its members exactly.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    groups = np.asarray(group_index)
    if rewards.ndim != 1 or groups.shape != rewards.shape or len(attempt_ids) != len(rewards):
        raise ValueError(f"rewards, group_index and attempt_ids need one entry per sample, got shapes "
                         f"{rewards.shape}, {groups.shape} and ({len(attempt_ids)},)")
    group_of_sample = groups.tolist()
    if not np.isfinite(rewards).all():
        bad = int(np.flatnonzero(~np.isfinite(rewards))[0])
        raise ValueError(f"sample {bad} (attempt {attempt_ids[bad]!r} of group {group_of_sample[bad]!r}) has reward "
                         f"{rewards[bad]}: rewards must be finite")

    attempt_number: dict[tuple[Hashable, Hashable], int] = {}
    sample_attempt = np.array([attempt_number.setdefault(key, len(attempt_number))
                               for key in zip(group_of_sample, attempt_ids, strict=True)], dtype=np.intp)
    attempt_reward = np.empty(len(attempt_number))
    attempt_reward[sample_attempt] = rewards
    differs = rewards != attempt_reward[sample_attempt]
    if differs.any():
        i = int(np.flatnonzero(differs)[0])
        same = sample_attempt == sample_attempt[i]
        raise ValueError(f"attempt {attempt_ids[i]!r} of group {group_of_sample[i]!r} has differing rewards "
                         f"{sorted(set(rewards[same].tolist()))} across its samples {np.flatnonzero(same).tolist()}: "
                         f"an attempt's samples must carry the attempt's one reward")

    attempt_group = np.array([group for group, _ in attempt_number])
    _, group_of = np.unique(attempt_group, return_inverse=True)
    attempts_in_group = np.bincount(group_of)
    mean = np.bincount(group_of, attempt_reward) / attempts_in_group
    advantage = attempt_reward - mean[group_of]
    if std_normalize:
        std = np.sqrt(np.bincount(group_of, advantage**2) / attempts_in_group)
        advantage /= std[group_of] + eps
    lowest = np.full(len(attempts_in_group), np.inf)
    highest = np.full(len(attempts_in_group), -np.inf)
    np.minimum.at(lowest, group_of, attempt_reward)
    np.maximum.at(highest, group_of, attempt_reward)
    advantage[(lowest == highest)[group_of]] = 0.0
    return advantage[sample_attempt]
