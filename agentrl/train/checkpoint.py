"""Trainer checkpoints: checkpoints/iter_<n>/ written aside and renamed in, then `latest` moved to n.

    iter_<n>/model.pt optimizer.pt rng.pt   the backend's state and every RNG
    iter_<n>/trainer.json                  TrainerState: rollouts done, steps, weight version, prompt source
    iter_<n>/hf/                           a Hugging Face export, for inference reloads and eval

A reader (a resumed trainer, an eval watcher) trusts only what `latest` names, or a directory whose
trainer.json is there: a directory appears whole (rename(2)) or not at all.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch

from hpc.fsio import fsync_dir, fsync_tree
from hpc.records import Record, read_record, write_record
from hpc.runlayout import RunLayout


class TrainerState(Record):
    kind: Literal["trainer_state"] = "trainer_state"
    schema_version: int = 1
    iteration: int            # rollouts trained on
    optimizer_steps: int
    weight_version: int
    prompt_source: dict[str, Any]


class Saveable(Protocol):
    def save(self, path: Path) -> None: ...
    def load(self, path: Path) -> None: ...
    def export_hf(self, path: Path) -> None: ...


def save_checkpoint(run: RunLayout, policy: Saveable, state: TrainerState, *, rank: int = 0,
                    collective: bool = False, barrier: Callable[[], None] = lambda: None) -> Path:
    """Write iter_<n> whole and point `latest` at it; returns its path.

    Rank 0 alone writes, unless the policy's save and export are collective (Megatron's sharded
    state: every rank writes its shard into the same directory); then every rank calls this."""
    n = state.iteration
    final = run.checkpoint_dir(n)
    # One name for all ranks when they write together; else this process's own.
    tmp = run.checkpoints_dir / (f".tmp-iter_{n}" if collective else
                                 f".tmp-iter_{n}-{socket.gethostname()}-{os.getpid()}")
    if rank == 0:
        run.checkpoints_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "hf").mkdir(parents=True)
    barrier()
    try:
        if rank == 0 or collective:
            policy.save(tmp)
            policy.export_hf(tmp / "hf")
        barrier()
        if rank == 0:
            torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                       tmp / "rng.pt")
            fsync_tree(tmp)      # on disk before the rename makes it a checkpoint
            write_record(tmp / "trainer.json", state)      # last: the directory is trusted with it only
            if final.exists():    # a crash after the rename, before `latest` moved: this one replaces it
                shutil.rmtree(final)
            os.rename(tmp, final)
            fsync_dir(run.checkpoints_dir)
            run.publish_latest(n)
    finally:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    return final


def load_latest(run: RunLayout, policy: Saveable | None = None) -> TrainerState | None:
    """The state of the checkpoint `latest` names (loading it into `policy` and the RNGs), or None."""
    n = run.latest_checkpoint()
    if n is None:
        return None
    path = run.checkpoint_dir(n)
    state = read_record(path / "trainer.json", TrainerState)
    if policy is not None:
        policy.load(path)
        rng = torch.load(path / "rng.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if rng.get("cuda") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
    return state


def prune(run: RunLayout, keep: int) -> list[Path]:
    """Remove all but the newest `keep` complete checkpoints (never the one `latest` names)."""
    latest = run.latest_checkpoint()
    done = sorted(int(p.name.removeprefix("iter_")) for p in run.checkpoints_dir.glob("iter_*")
                  if p.name.removeprefix("iter_").isdigit() and (p / "trainer.json").exists())
    gone = [n for n in done[:-keep] if n != latest] if keep > 0 else []
    for n in gone:
        shutil.rmtree(run.checkpoint_dir(n), ignore_errors=True)
    return [run.checkpoint_dir(n) for n in gone]
