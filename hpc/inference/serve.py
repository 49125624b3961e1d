"""The inference role (`agentrl serve`): one model server per task, registered as services/inference-<task index>.

    agentrl serve                                  # under the launcher: $AGENTRL_RUN_DIR/run.yaml's config
    agentrl serve --config FILE --run-dir RUN      # by hand: FILE's config; RUN is created if missing

The config's `inference:` section:

    inference:
      engine: sglang           # or cpu: the CPU stand-in (hpc.inference.cpu_server), for tests and trials
      model: /shared/models/Qwen3-8B
      port: 30000              # the base: task i listens on port + i, so servers that share a node do not collide
      tp: 4                    # sglang: any other SGLangConfig field (hpc/inference/sglang.py), e.g.
      container: /shared/images/sglang.sif     # SGLang's Apptainer image (containers/README.md)
      heartbeat_s: 5           # both engines
      threads: 1               # cpu: torch's intra-op threads (1: a tiny model's decode step does not split well)
      health_timeout_s: 1800   # sglang: how long loading and warmup may take

It serves until SIGTERM or SIGINT and exits 0; exits 1 when the server cannot start or dies (the role's
restart policy starts it again), 2 on a bad config, naming the field.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..environment import RoleEnv
from ..runlayout import RunLayout
from ..validation import problems
from . import cpu_server
from .cpu_server import SERVER_THREADS
from .sglang import SGLangConfig, advertised_host

ENGINES = ("sglang", "cpu")


class InferenceConfigError(ValueError):
    """The inference section cannot be served; the message names the field."""


class CpuServe(BaseModel):
    """`engine: cpu`: the CPU stand-in's options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal["cpu"]
    model: Path
    host: str = "0.0.0.0"
    port: int = Field(default=30000, ge=1, le=65535)
    weight_version: str = "default"
    heartbeat_s: float = Field(default=5.0, gt=0)
    threads: int = Field(default=SERVER_THREADS, ge=1)     # torch's intra-op threads while it serves
    dtype: Literal["float32", "bfloat16"] = "float32"     # the served weights' (the trainer's are float32)
    enable_return_routed_experts: bool = False            # an MoE model: routes for routing replay


class SGLangServe(SGLangConfig):
    """`engine: sglang`: SGLangConfig, with the section's `model` and the role's own settings."""

    engine: Literal["sglang"]
    model_path: Path = Field(alias="model")
    heartbeat_s: float = Field(default=5.0, gt=0)
    health_timeout_s: float = Field(default=1800.0, gt=0)

    def for_task(self, index: int, run_root: Path) -> SGLangConfig:
        """Task `index`'s server: the base port + index; in a container, the model and the run are bound."""
        fields = self.model_dump(exclude={"engine", "heartbeat_s", "health_timeout_s"})
        fields["port"] = self.port + index
        if self.container is not None:
            # update_weights_from_disk names checkpoints under the run directory: SGLang must see both paths.
            wanted = [str(self.model_path), str(run_root)]
            fields["binds"] = [*self.binds, *(p for p in wanted if p not in self.binds)]
        return SGLangConfig(**fields)


def parse_inference(section: Any, index: int, source: str = "inference") -> CpuServe | SGLangServe:
    """The section as its engine's settings, checked for task `index`; InferenceConfigError names the field."""
    if not isinstance(section, dict):
        raise InferenceConfigError(f"{source}: needs a mapping with engine and model (see hpc/inference/serve.py)")
    engine = section.get("engine")
    if engine not in ENGINES:
        raise InferenceConfigError(f"{source}.engine: must be one of {', '.join(ENGINES)}, not {engine!r}")
    try:
        parsed = (SGLangServe if engine == "sglang" else CpuServe).model_validate(section)
    except ValidationError as e:
        raise InferenceConfigError("\n".join(f"{source}.{field}: {msg}" for field, msg in problems(e))) from None
    if parsed.port + index > 65535:
        raise InferenceConfigError(f"{source}.port: {parsed.port} + task index {index} is above 65535")
    return parsed


def gpu_shortfall(cfg: SGLangServe, env: RoleEnv, source: str = "inference") -> str | None:
    """Why this task's GPUs cannot hold tp x dp ranks, or None."""
    needed = cfg.tp * cfg.dp
    if env.visible_gpus is None or len(env.visible_gpus) >= needed:
        return None
    return (f"{source}: tp {cfg.tp} x dp {cfg.dp} needs {needed} GPUs, this task has {len(env.visible_gpus)} "
            f"(CUDA_VISIBLE_DEVICES={','.join(env.visible_gpus)}): raise the role's gpus_per_task or lower tp/dp")


def cpu_server_options(cfg: CpuServe, run_root: Path, index: int,
                       liveness_file: Path | None = None) -> cpu_server.ServeOptions:
    """How hpc.inference.cpu_server serves task `index`: registered in the run, heartbeating itself."""
    return cpu_server.ServeOptions(model=cfg.model, host=cfg.host, port=cfg.port + index,
                                   weight_version=cfg.weight_version, register=run_root, index=index,
                                   heartbeat_s=cfg.heartbeat_s, liveness_file=liveness_file, threads=cfg.threads,
                                   dtype=cfg.dtype, enable_return_routed_experts=cfg.enable_return_routed_experts)


def run_sglang(cfg: SGLangServe, run_root: Path, index: int, liveness_file: Path | None = None) -> int:
    """Serve task `index` until SIGTERM/SIGINT (0); 1 if the server cannot start or exits by itself."""
    from ..registry import Registry
    from .sglang import ServerError, ServerProcess

    sglang = cfg.for_task(index, run_root)
    layout = RunLayout(run_root)
    log_path = layout.log_path(f"inference-{index}.sglang")
    server = ServerProcess.of(sglang, log_path, registry=Registry(layout.services_dir), index=index,
                              heartbeat_s=cfg.heartbeat_s, health_timeout_s=cfg.health_timeout_s,
                              liveness_file=liveness_file)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.request_stop())
    print(f"agentrl serve: inference-{index} starts SGLang on port {sglang.port}; its log: {log_path}", flush=True)
    try:
        with server:
            if server.start():
                print(f"agentrl serve: inference-{index} serves http://{advertised_host(sglang.host)}:{sglang.port}",
                      flush=True)
                server.serve()
    except ServerError as e:
        print(f"agentrl serve: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"agentrl serve: inference-{index} stopped", flush=True)
    return 0


def with_published_weights(cfg: CpuServe | SGLangServe, run_root: Path) -> CpuServe | SGLangServe:
    """A server (re)started mid-run serves the weights the trainer last published, not the base model."""
    layout = RunLayout(run_root)
    found = layout.published_weights() if layout.checkpoints_dir.is_dir() else None
    if found is None:
        return cfg
    version, path = found
    if isinstance(cfg, CpuServe):
        return cfg.model_copy(update={"model": path, "weight_version": str(version)})
    return cfg.model_copy(update={"model_path": path, "weight_version": str(version)})


def serve(section: Any, run_root: Path, env: RoleEnv, source: str = "inference") -> int:
    """Run this task's server from a config's inference section (raises InferenceConfigError first if it is bad)."""
    cfg = parse_inference(section, env.task_index, source)
    cfg = with_published_weights(cfg, run_root)
    if isinstance(cfg, CpuServe):
        return cpu_server.run(cpu_server_options(cfg, run_root, env.task_index, env.heartbeat_file))
    if problem := gpu_shortfall(cfg, env, source):
        raise InferenceConfigError(problem)
    return run_sglang(cfg, run_root, env.task_index, env.heartbeat_file)
