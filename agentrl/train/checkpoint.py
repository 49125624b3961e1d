"""Trainer checkpoints: checkpoints/iter_<n>/ written aside and renamed in; `latest` names the newest full one.

    iter_<n>/model.pt optimizer.pt rng.pt   the backend's state and every RNG (a full checkpoint only)
    iter_<n>/trainer.json                  TrainerState: rollouts done, steps, weight version, prompt source,
                                           the last rollout's metrics line
    iter_<n>/hf/                           a Hugging Face export, for inference reloads and eval

A full checkpoint (every `save_every` rollouts, and the last) is what a resumed trainer loads; the
rollouts between that publish weights write only the export (`full: false`): a quarter of the bytes
in float32, without the weights' second copy and Adam's two moments. A reader (a resumed trainer,
an eval watcher) trusts only what `latest` names, or a directory whose trainer.json is there: a
directory appears whole (rename(2)) or not at all.

Retention (`retention_plan`, pure; `apply_retention`, its shell) keeps the newest `keep_last` full
checkpoints' state, and drops an export once its eval summary exists (keep_exports: until_evaluated),
never the weights the servers were last told to load.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch

from hpc.fsio import fsync_dir, fsync_tree
from hpc.records import Record, read_record, write_record
from hpc.runlayout import EvalLayout, RunLayout


class TrainerState(Record):
    kind: Literal["trainer_state"] = "trainer_state"
    schema_version: int = 1
    iteration: int            # rollouts trained on
    optimizer_steps: int
    weight_version: int
    prompt_source: dict[str, Any]
    full: bool = True         # the backend's state and RNGs are here: a resumed trainer may load it
    # The trained rollout's metrics line as it stood at the save (before publishing): a trainer that died
    # publishing, after this checkpoint, resumes past the rollout and writes the line it lost from here.
    metrics: dict[str, Any] | None = None


class Saveable(Protocol):
    def save(self, path: Path) -> None: ...
    def load(self, path: Path) -> None: ...
    def export_hf(self, path: Path) -> None: ...


def save_checkpoint(run: RunLayout, policy: Saveable, state: TrainerState, *, rank: int = 0,
                    collective: bool = False, barrier: Callable[[], None] = lambda: None) -> Path:
    """Write iter_<n> whole and, if it is full (`state.full`), point `latest` at it; returns its path.
    One that is not holds only the HF export (and trainer.json).

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
            if state.full:
                policy.save(tmp)
            policy.export_hf(tmp / "hf")
        barrier()
        if rank == 0:
            if state.full:
                torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                            "python": random.getstate(),
                            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                           tmp / "rng.pt")
            fsync_tree(tmp)      # on disk before the rename makes it a checkpoint
            write_record(tmp / "trainer.json", state)      # last: the directory is trusted with it only
            if final.exists():    # a crash after the rename, before `latest` moved: this one replaces it
                shutil.rmtree(final)
            os.rename(tmp, final)
            fsync_dir(run.checkpoints_dir)
            if state.full:
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


@dataclass(frozen=True)
class Retention:
    drop_state: tuple[int, ...]       # full checkpoints whose backend state and RNGs go (trainer.json, hf/ stay)
    drop_export: tuple[int, ...]      # checkpoints whose hf/ goes


def retention_plan(checkpoints: Mapping[int, tuple[bool, bool]], *, keep_last: int, keep_exports: str,
                   evaluated: Set[int], published: int | None, latest: int | None) -> Retention:
    """What to remove, given each complete checkpoint's (full, has an export): all but the newest
    `keep_last` full ones lose their state (never the one `latest` names); an export whose eval summary
    exists goes with keep_exports "until_evaluated" (never the published weights)."""
    full = sorted(n for n, (is_full, _) in checkpoints.items() if is_full)
    drop_state = tuple(n for n in full[:-keep_last] if n != latest)
    drop_export = () if keep_exports == "all" else tuple(
        sorted(n for n, (_, has_hf) in checkpoints.items() if has_hf and n in evaluated and n != published))
    return Retention(drop_state, drop_export)


def apply_retention(run: RunLayout, *, keep_last: int, keep_exports: str) -> Retention:
    """Rank 0's pruning after a rollout's checkpoint and publish (retention_plan, on what is on disk)."""
    complete = {}
    for p in run.checkpoints_dir.glob("iter_*"):
        suffix = p.name.removeprefix("iter_")
        if suffix.isdigit() and (p / "trainer.json").is_file():
            state = read_record(p / "trainer.json", TrainerState)
            complete[int(suffix)] = (state.full, (p / "hf").is_dir())
    published = run.published_weights()
    plan = retention_plan(complete, keep_last=keep_last, keep_exports=keep_exports,
                          evaluated={n for n in complete if EvalLayout(run.eval_dir(n)).summary_path.is_file()},
                          published=published[0] if published else None, latest=run.latest_checkpoint())
    for n in plan.drop_state:
        path = run.checkpoint_dir(n)
        state = read_record(path / "trainer.json", TrainerState)
        write_record(path / "trainer.json", state.model_copy(update={"full": False}))   # first: never half a state
        for entry in path.iterdir():
            if entry.name not in ("hf", "trainer.json"):
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for n in plan.drop_export:
        shutil.rmtree(run.checkpoint_dir(n) / "hf", ignore_errors=True)
    return plan
