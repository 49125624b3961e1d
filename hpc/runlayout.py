"""The run directory on the shared filesystem: its paths and its manifest.

    RUN/
      run.yaml                  resolved config, written once
      services/<role>-<i>.json  service registry (hpc.registry)
      ledger/                   rollout ledger (hpc.ledger)
      buffer/rollout_<id>/      sample shards (hpc.buffer)
      checkpoints/iter_<n>/     trainer state; checkpoints/latest names the newest complete one
      eval/iter_<n>/            per-checkpoint eval results (EvalLayout)
      launch/                   the launch's plan, state, task records, heartbeats, sbatch script (hpc.launch)
      trajectories/  metrics.jsonl  logs/

Every path of a run directory is named here, and nowhere else.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .environment import Writer
from .fsio import probe_filesystem, read_bytes, write_atomic
from .records import Record, RecordError, create_record, read_record, write_record


class RunDirError(Exception):
    """The directory is not the run directory the caller asked for."""


class RunManifest(Record):
    kind: Literal["run"] = "run"
    schema_version: int = 1
    run_id: str
    created: float
    config: dict[str, Any] = {}


_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _check_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r}: use letters, digits, '.', '_' or '-' "
                         "(at most 128, not starting with a symbol)")
    return run_id


@dataclass(frozen=True)
class RunLayout:
    root: Path

    # -- paths ---------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.root / "run.yaml"

    @property
    def services_dir(self) -> Path:
        return self.root / "services"

    @property
    def ledger_dir(self) -> Path:
        return self.root / "ledger"

    @property
    def buffer_dir(self) -> Path:
        return self.root / "buffer"

    def rollout_buffer_dir(self, rollout_id: int) -> Path:
        return self.buffer_dir / f"rollout_{rollout_id}"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint_dir(self, iteration: int) -> Path:
        return self.checkpoints_dir / f"iter_{iteration}"

    @property
    def evals_dir(self) -> Path:
        return self.root / "eval"

    def eval_dir(self, iteration: int) -> Path:
        return self.evals_dir / f"iter_{iteration}"

    @property
    def trajectories_dir(self) -> Path:
        return self.root / "trajectories"

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    def log_path(self, name: str) -> Path:
        return self.logs_dir / f"{name}.log"

    # launch/: what hpc.launch records of the run's launches
    @property
    def launch_dir(self) -> Path:
        return self.root / "launch"

    @property
    def plan_path(self) -> Path:
        return self.launch_dir / "plan.json"

    @property
    def end_path(self) -> Path:
        return self.launch_dir / "end.json"

    @property
    def sbatch_script_path(self) -> Path:
        return self.launch_dir / "job.sbatch"

    @property
    def submitit_dir(self) -> Path:
        return self.launch_dir / "submitit"

    @property
    def task_records_dir(self) -> Path:
        return self.launch_dir / "tasks"

    def task_record_path(self, role: str, index: int) -> Path:
        return self.task_records_dir / f"{role}-{index}.json"

    def heartbeat_path(self, role: str, index: int) -> Path:
        return self.launch_dir / "heartbeats" / f"{role}-{index}"

    @staticmethod
    def holds_run(path: Path | str) -> bool:
        """Whether `path` is a run directory (it has a manifest)."""
        return (Path(path) / "run.yaml").exists()

    # -- lifecycle -----------------------------------------------------------
    @classmethod
    def create(cls, root: Path | str, config: dict[str, Any] | None = None,
               run_id: str | None = None) -> RunLayout:
        """Make a new run directory, or reopen it if it already holds `run_id`."""
        layout = cls(Path(root).absolute())
        run_id = _check_run_id(run_id or f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}")
        layout.root.mkdir(parents=True, exist_ok=True)
        if problems := probe_filesystem(layout.root):
            raise RunDirError(f"{layout.root}: its filesystem lacks what the run's files need: "
                              + "; ".join(problems))
        manifest = RunManifest(run_id=run_id, created=time.time(), config=config or {})
        # Written once: link(2) refuses to replace a manifest another process wrote first.
        if not create_record(layout.manifest_path, manifest):
            return cls.open(layout.root, run_id=run_id)
        for d in (layout.services_dir, layout.ledger_dir, layout.buffer_dir, layout.checkpoints_dir,
                  layout.trajectories_dir, layout.logs_dir):
            d.mkdir(exist_ok=True)
        return layout

    @classmethod
    def open(cls, root: Path | str, run_id: str | None = None) -> RunLayout:
        """Open an existing run directory; with `run_id`, refuse one that holds another run."""
        layout = cls(Path(root).absolute())
        if not layout.manifest_path.exists():
            raise RunDirError(f"{layout.root} is not a run directory (no run.yaml); "
                              "create one with RunLayout.create() or `agentrl launch`")
        found = layout.manifest().run_id
        if run_id is not None and found != run_id:
            raise RunDirError(f"{layout.root} holds run {found!r}, not {run_id!r}: "
                              f"point at the directory of {run_id!r}, or choose a new directory")
        return layout

    def manifest(self) -> RunManifest:
        return read_record(self.manifest_path, RunManifest)

    def amend_config(self, config: dict[str, Any]) -> None:
        """Replace the run's config, keeping its id (a continued run that changed what may change).

        The manifest before is kept, whole, as launch/config-history/<n>.yaml; then run.yaml is
        replaced atomically. Only while no role runs: they read it when they start.
        """
        old = self.manifest()
        history = self.launch_dir / "config-history"
        history.mkdir(parents=True, exist_ok=True)
        n = len(list(history.glob("*.yaml")))
        while not create_record(history / f"{n}.yaml", old):
            n += 1
        write_record(self.manifest_path, old.model_copy(update={"config": config, "writer": Writer.current()}))

    def config_base(self) -> Path:
        """What relative paths in the run's config are relative to: the config file's directory, which
        `agentrl launch` records as config_dir, else the run directory."""
        found = self.manifest().config.get("config_dir")
        return Path(found) if found else self.root

    # -- the `latest` checkpoint pointer -------------------------------------
    def publish_latest(self, iteration: int) -> None:
        """Point checkpoints/latest at iter_<n>; call only once iter_<n> is complete."""
        if not self.checkpoint_dir(iteration).is_dir():
            raise FileNotFoundError(f"{self.checkpoint_dir(iteration)} does not exist")
        write_atomic(self.checkpoints_dir / "latest", f"{iteration}\n".encode())

    # -- the weights inference serves: what a (re)started server must load ---------
    @property
    def published_weights_path(self) -> Path:
        return self.checkpoints_dir / "published.json"

    def publish_weights(self, version: int, model_path: Path) -> None:
        """Record that inference is to serve `model_path` as `version`: what a (re)started server loads."""
        write_atomic(self.published_weights_path,
                     json.dumps({"weight_version": version, "model_path": str(model_path)}).encode())

    def published_weights(self) -> tuple[int, Path] | None:
        """(version, HF directory) of the weights last published, or None before the first publish."""
        try:
            data = json.loads(read_bytes(self.published_weights_path))
            return int(data["weight_version"]), Path(data["model_path"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as e:
            raise RecordError(self.published_weights_path, f"is not a weights record ({e})",
                              "remove it: servers then start from the base model until the next publish") from None

    def latest_checkpoint(self) -> int | None:
        path = self.checkpoints_dir / "latest"
        try:
            text = read_bytes(path).decode().strip()
        except FileNotFoundError:
            return None
        if not text.isdigit():
            raise RecordError(path, f"holds {text!r}, not an iteration number",
                              "rewrite it with the number of the newest complete checkpoint")
        return int(text)


@dataclass(frozen=True)
class EvalLayout:
    """One checkpoint's eval directory (RUN/eval/iter_<n>, or an eval's --out):

        ledger/            which (task, attempt) is claimed or done
        attempts/          one result file per committed try
        trajectories/      each attempt's trace
        samples/           with save_samples: the attempts' samples as buffer shards
        logs/              the model server's log
        results.jsonl      one line per attempt, sorted
        summary.json       written last: an iteration with it is scored
    """
    root: Path

    @property
    def ledger_dir(self) -> Path:
        return self.root / "ledger"

    @property
    def attempts_dir(self) -> Path:
        return self.root / "attempts"

    @property
    def trajectories_dir(self) -> Path:
        return self.root / "trajectories"

    @property
    def samples_dir(self) -> Path:
        return self.root / "samples"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def results_path(self) -> Path:
        return self.root / "results.jsonl"

    @property
    def summary_path(self) -> Path:
        return self.root / "summary.json"
