"""A rollout's metrics from its samples (pure): reward, pass@k over attempts, empty patches, drift, fidelity,
timings.

An attempt whose trajectory fanned out into several samples is one attempt: pass@k and the reward
mean count (group, attempt) pairs, never samples. Inputs that do not fit a metric (samples of one
attempt that disagree on the reward, missing metadata) are logged as errors and counted in
`metric_input_errors`; they never turn into an empty or silently wrong figure.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from math import comb
from typing import Any

import numpy as np

from ..sample import Sample

log = logging.getLogger("agentrl.metrics")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n attempts of which c passed (Chen et al., 2021)."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def rollout_report(samples: Sequence[Sample], *, ks: Sequence[int] = (1,), rollout_s: float | None = None,
                   infra_failures: int = 0) -> dict[str, Any]:
    errors = 0
    attempts: dict[tuple[int, int], Sample] = {}
    for s in samples:
        key = (s.group_index, s.attempt)
        first = attempts.setdefault(key, s)
        if first.reward != s.reward:
            errors += 1
            log.error("group %d attempt %d: its samples disagree on the reward (%g, %g)", *key, first.reward, s.reward)
    if not attempts:
        log.error("a rollout report of no samples")
        return {"attempts": 0, "metric_input_errors": errors + 1}
    groups: dict[int, list[float]] = {}
    for (g, _a), s in attempts.items():
        groups.setdefault(g, []).append(s.reward)
    out: dict[str, Any] = {
        "groups": len(groups), "attempts": len(attempts), "samples": len(samples),
        "samples_per_attempt": len(samples) / len(attempts),
        "reward_mean": float(np.mean([s.reward for s in attempts.values()])),
        "zero_variance_groups": sum(len(set(r)) == 1 for r in groups.values()),
        "response_tokens": int(sum(s.response_length for s in samples)),
        "trained_tokens": int(sum(int(s.loss_mask.sum()) for s in samples)),
        "infra_failures": infra_failures,
    }
    for k in ks:
        usable = [r for r in groups.values() if len(r) >= k]
        if len(usable) < len(groups):
            errors += len(groups) - len(usable)
            log.error("pass@%d: %d groups have fewer than %d attempts", k, len(groups) - len(usable), k)
        if usable:
            out[f"pass@{k}"] = float(np.mean([pass_at_k(len(r), sum(x > 0 for x in r), k) for r in usable]))
    empty = Counter(s.metadata.empty_patch.value if s.metadata.empty_patch else None for s in attempts.values())
    if None in empty:
        unlabelled = empty.pop(None)
        errors += unlabelled
        log.error("%d attempts carry no empty_patch label", unlabelled)
    if empty:
        triggered = sum(n for cls, n in empty.items() if cls != "not_triggered")
        out["empty_patch_rate"] = triggered / len(attempts)
        out.update({f"empty_patch/{cls}": n for cls, n in sorted(empty.items()) if cls != "not_triggered"})
    drift: Counter = Counter()
    for s in attempts.values():
        drift.update(s.metadata.drift)
    out.update({f"drift/{k}": v for k, v in sorted(drift.items())})
    out.update(fidelity(samples, attempts))
    timings: dict[str, list[float]] = {}
    for s in attempts.values():
        for name, seconds in s.metadata.timings().items():
            timings.setdefault(name, []).append(seconds)
    out.update({f"time/{name}_mean": float(np.mean(values)) for name, values in timings.items()})
    if rollout_s:
        out["attempts_per_hour"] = len(attempts) * 3600.0 / rollout_s
        out["trained_tokens_per_s"] = out["trained_tokens"] / rollout_s
    out["metric_input_errors"] = errors
    return out


def fidelity(samples: Sequence[Sample], attempts: dict[tuple[int, int], Sample]) -> dict[str, float]:
    """How the sample path fared (docs/agent-clis.md): forks per attempt, every new chain of a session (a FORK
    drift, or a branch under an earlier turn: with mini-swe-agent, a format error each); samples per attempt
    that never forked (1 unless a clean session is split); and the adapter's own time per model call."""
    per_attempt = Counter((s.group_index, s.attempt) for s in samples)
    forks = {key: s.metadata.drift.get("fork", 0) + (s.metadata.branches or 0) for key, s in attempts.items()}
    clean = [per_attempt[key] for key, n in forks.items() if not n]
    out: dict[str, float] = {"forks_per_attempt": sum(forks.values()) / len(attempts)}
    if clean:
        out["samples_per_clean_attempt"] = sum(clean) / len(clean)
    timed = [s.metadata for s in attempts.values() if s.metadata.adapter_s is not None and s.metadata.turns]
    if timed:
        out["adapter_ms_per_turn"] = 1000 * sum(m.adapter_s or 0.0 for m in timed) / sum(m.turns or 0 for m in timed)
    return out
