"""Where the trainer's per-rollout metrics go besides metrics.jsonl: Weights & Biases.

Offline by default: a cluster's compute nodes rarely reach the internet, and an offline run in
RUN/wandb/ can be uploaded later with `wandb sync RUN/wandb/offline-run-*`. `online` sends as it
goes. Without the wandb package (an optional extra: pip install agentrl-hpc[wandb]) the metrics
stay in metrics.jsonl and one line says so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

log = logging.getLogger("agentrl.train")


class TrackingConfig(BaseModel):
    """`train.tracking`."""

    model_config = ConfigDict(extra="forbid")

    wandb: Literal["offline", "online", "disabled"] = "offline"
    project: str = "agentrl"
    entity: str | None = None
    name: str | None = None          # default: the run id


class Tracker(Protocol):
    def log(self, metrics: Mapping[str, Any], step: int) -> None: ...
    def close(self) -> None: ...


class NoTracker:
    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        return None

    def close(self) -> None:
        return None


class WandbTracker:
    def __init__(self, cfg: TrackingConfig, run_dir: Path, run_id: str, config: Mapping[str, Any]):
        import wandb

        self._run = wandb.init(project=cfg.project, entity=cfg.entity, name=cfg.name or run_id, id=run_id,
                               resume="allow", mode=cfg.wandb, dir=str(run_dir), config=dict(config))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        # W&B plots numbers; the fingerprint and such stay in metrics.jsonl.
        self._run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def close(self) -> None:
        self._run.finish()


def make_tracker(cfg: TrackingConfig, run_dir: Path, run_id: str, config: Mapping[str, Any]) -> Tracker:
    if cfg.wandb == "disabled":
        return NoTracker()
    try:
        import wandb  # noqa: F401
    except ImportError:
        log.info("wandb is not installed (pip install agentrl-hpc[wandb]): metrics go to metrics.jsonl only")
        return NoTracker()
    return WandbTracker(cfg, run_dir, run_id, config)
