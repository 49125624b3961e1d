"""Intervals for pass@1 from an eval's results.jsonl: resampled by task, since a task's attempts agree.

A task's attempts succeed or fail together far more often than independent draws would (the same
repository, the same bug), so an interval that treats every attempt as independent is too narrow.
These bootstrap the tasks instead (percentile intervals, a seeded generator: the same results give
the same interval), and a difference between two checkpoints is bootstrapped over the tasks both
scored, pairing each task with itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpc.runlayout import EvalLayout

RESAMPLES = 4000


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float
    attempts: int
    tasks: int

    def __str__(self) -> str:
        return f"{100 * self.value:5.1f} [{100 * self.low:5.1f}, {100 * self.high:5.1f}]"


def task_rates(results: list[dict]) -> dict[str, tuple[int, int]]:
    """task -> (passed attempts, attempts)."""
    out: dict[str, list[int]] = {}
    for r in results:
        passed, n = out.setdefault(r["task"], [0, 0])
        out[r["task"]] = [passed + (r["reward"] > 0), n + 1]
    return {t: (p, n) for t, (p, n) in out.items()}


def read_results(eval_dir: Path) -> list[dict]:
    path = EvalLayout(Path(eval_dir)).results_path
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no results (run `agentrl eval` into {eval_dir} first)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _percentiles(values: np.ndarray, level: float) -> tuple[float, float]:
    """The central `level` interval of resampled values (percentile bootstrap)."""
    tail = (1 - level) / 2
    return float(np.quantile(values, tail)), float(np.quantile(values, 1 - tail))


def _resample_tasks(n_tasks: int, seed: int) -> np.ndarray:
    """RESAMPLES draws of n_tasks task indices, with replacement: one row per resample."""
    return np.random.default_rng(seed).integers(0, n_tasks, size=(RESAMPLES, n_tasks))


def pass_at_1(results: list[dict], *, level: float = 0.95, seed: int = 0) -> Estimate:
    """pass@1 over all attempts, with a task-resampled interval."""
    rates = task_rates(results)
    if not rates:
        raise ValueError("no results: nothing to estimate")
    passed = np.array([p for p, _ in rates.values()], float)
    counts = np.array([n for _, n in rates.values()], float)
    pick = _resample_tasks(len(counts), seed)
    low, high = _percentiles(passed[pick].sum(axis=1) / counts[pick].sum(axis=1), level)
    return Estimate(float(passed.sum() / counts.sum()), low, high, int(counts.sum()), len(rates))


def paired_difference(after: list[dict], before: list[dict], *, level: float = 0.95, seed: int = 0) -> Estimate:
    """pass@1(after) - pass@1(before) over the tasks both hold, each task resampled as a pair."""
    a, b = task_rates(after), task_rates(before)
    tasks = sorted(a.keys() & b.keys())
    if not tasks:
        raise ValueError("the two results share no task: a paired difference needs the same task set")
    rate = np.array([[a[t][0] / a[t][1], b[t][0] / b[t][1]] for t in tasks])
    diff = rate[:, 0] - rate[:, 1]
    low, high = _percentiles(diff[_resample_tasks(len(tasks), seed)].mean(axis=1), level)
    return Estimate(float(diff.mean()), low, high, sum(a[t][1] for t in tasks), len(tasks))
