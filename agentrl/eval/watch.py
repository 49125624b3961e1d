"""`agentrl eval --watch RUN`: score each checkpoint of a run as it lands, beside training.

A checkpoint is complete once its trainer.json is there: the trainer writes it last, and renames
the whole directory into place (agentrl/train/checkpoint.py), so a half-written checkpoint is never
read. Scoring is idempotent and resumable (agentrl/eval/score.py): a killed watcher started again
finishes what it started, and watchers beside each other share the work and never score an
attempt twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from hpc.runlayout import EvalLayout, RunLayout

from ..swe.loaded import LoadedTask
from .config import EvalConfig
from .score import CheckpointEval

log = logging.getLogger("agentrl.eval")


def complete_checkpoints(run: RunLayout) -> list[int]:
    """The iterations whose checkpoint directory is whole (trainer.json and an HF export)."""
    found = []
    if run.checkpoints_dir.is_dir():
        for p in run.checkpoints_dir.glob("iter_*"):
            n = p.name.removeprefix("iter_")
            if n.isdigit() and (p / "trainer.json").is_file() and (p / "hf" / "config.json").is_file():
                found.append(int(n))
    return sorted(found)


def pending(run: RunLayout, every: int = 1) -> list[int]:
    return [n for n in complete_checkpoints(run)
            if n % every == 0 and not EvalLayout(run.eval_dir(n)).summary_path.exists()]


async def watch(run: RunLayout, cfg: EvalConfig, tasks: Sequence[LoadedTask], *, stop: asyncio.Event,
                until: Callable[[RunLayout], bool] | None = None) -> list[int]:
    """Score new checkpoints until `stop` (or `until(run)` is true with nothing left); the iterations scored."""
    scored = []
    while not stop.is_set():
        todo = pending(run, cfg.every)
        for n in todo:
            if stop.is_set():
                break
            log.info("scoring checkpoint iter_%d", n)
            summary = await CheckpointEval(run.eval_dir(n), cfg, tasks, n).run(run.checkpoint_dir(n) / "hf")
            log.info("iter_%d: pass@1 %s, pass@%d %s", n, summary["pass@1"], summary["k"], summary["pass@k"])
            scored.append(n)
        if not todo and until is not None and until(run):
            break
        if not todo:
            try:
                await asyncio.wait_for(stop.wait(), cfg.poll_s)
            except asyncio.TimeoutError:
                pass
    return scored


def training_ended(run: RunLayout) -> bool:
    """The trainer wrote its last checkpoint: the run's end record says so."""
    from hpc.launch.state import final_state

    return final_state(run) is not None

