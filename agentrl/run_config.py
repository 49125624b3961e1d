"""One run config: every section of a run's YAML, checked at launch, its paths resolved in one place.

    run_id, run_dir    which run (run_dir: where, unless `--run-dir` says)
    launch:            the roles and their Slurm resources (hpc.launch.plan)
    inference:         the model servers (hpc.inference.serve)
    train:             the trainer (agentrl.train.config)
    pool:              the rollout pool (agentrl.pool.config)
    eval:              checkpoint eval (agentrl.eval.config)
    config_dir         recorded by `agentrl launch`: the directory of the file it was given

`load_run_config(data, base, source)` makes every relative path absolute against `base` (the config
file's directory) and validates every section there is, reporting all problems at once as
`source: section.field: problem` lines. `agentrl launch` calls it before anything is submitted and
stores the resolved config in run.yaml; each role reads its section back with `role_context` (its run
directory, launcher environment and `role_config`), the one way a role gets its config.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel, ConfigDict

from hpc.environment import RoleEnv
from hpc.inference import routing
from hpc.inference.serve import CpuServe, InferenceConfigError, SGLangServe, parse_inference
from hpc.launch.plan import Plan, PlanError, load_plan
from hpc.runlayout import RunLayout
from hpc.validation import ConfigFileError, read_yaml_file

from .eval.config import EvalConfig, EvalConfigError, load_eval_config
from .pool.config import PoolConfig, PoolConfigError, load_pool_config
from .train.config import TrainConfig, TrainConfigError, load_train_config, moe_tensor_parallel_refusal

SECTIONS = ("launch", "inference", "train", "pool", "eval")
TOP_LEVEL = ("run_id", "run_dir", "config_dir", *SECTIONS)
# section (dotted) -> its keys that hold a path, relative to the config file's directory
PATH_KEYS: dict[str, tuple[str, ...]] = {
    "train": ("model", "prompt_data"),
    "pool": ("image_cache", "scratch_dir", "tools_dir"),
    "eval": ("tasks",),
    "eval.pool": ("image_cache", "scratch_dir", "tools_dir"),
    "inference": ("model", "container"),
}


class RunConfigError(ValueError):
    """The run config cannot be used; one line per problem, each naming the file and the field."""


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str                            # where it was read from, for messages
    raw: dict[str, Any]                    # the config as given, its paths resolved: what run.yaml stores
    train: TrainConfig | None = None
    pool: PoolConfig | None = None
    eval: EvalConfig | None = None
    plan: Plan | None = None                          # launch:, with check_launch
    inference: CpuServe | SGLangServe | None = None   # as task 0 serves it (each task: parse_inference)
    # What the config names that is not there, where paths went unchecked (load_run_config's check_paths)
    missing_paths: tuple[str, ...] = ()

    def section(self, name: str) -> Any:
        """A section a role needs: its typed model (train, pool, eval) or its mapping (launch, inference)."""
        found = getattr(self, name) if name in ("train", "pool", "eval") else self.raw.get(name)
        if found is None:
            raise RunConfigError(f"{self.source}: has no `{name}:` section (see docs/launch.md)")
        return found


def _absolute(value: Any, base: Path) -> Any:
    if isinstance(value, str) and value and not Path(value).is_absolute():
        return str((base / value).resolve())
    return value


def resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """A copy of the config with every relative path (PATH_KEYS, inference binds) made absolute against base."""
    out = copy.deepcopy(data)
    for dotted, keys in PATH_KEYS.items():
        section: Any = out
        for part in dotted.split("."):
            section = section.get(part) if isinstance(section, dict) else None
        if isinstance(section, dict):
            for key in keys:
                if key in section:
                    section[key] = _absolute(section[key], base)
    inference = out.get("inference")
    if isinstance(inference, dict) and isinstance(inference.get("binds"), list):
        # "src" or "src:dst": the source is on the host, relative to the config; the target is the container's
        inference["binds"] = [":".join([_absolute(b.split(":", 1)[0], base), *b.split(":", 1)[1:]])
                              if isinstance(b, str) else b for b in inference["binds"]]
    return out


def load_run_config(data: Any, base: Path, source: str, *, partitions: dict[str, Any] | None = None,
                    check_launch: bool = False, check_paths: bool = True) -> RunConfig:
    """The config with its paths resolved and every section validated; RunConfigError lists every problem.

    check_launch also validates `launch:` (with the cluster's partitions, when it names none). Without
    check_paths, a path that does not exist (the model, the prompt data) is no problem but is listed in
    `missing_paths`: a dry run off the cluster previews a plan whose paths exist only there.
    """
    if not isinstance(data, dict):
        raise RunConfigError(f"{source}: a run config is a mapping of sections ({', '.join(SECTIONS)})")
    problems = [f"{source}: {key}: unknown section (a typo? the sections are {', '.join(TOP_LEVEL)})"
                for key in data if key not in TOP_LEVEL]
    raw = resolve_paths(data, base)
    typed: dict[str, Any] = {}
    if check_launch:
        try:
            if "launch" not in raw:
                raise PlanError("has no `launch:` section: what to run where (docs/launch.md)")
            typed["plan"] = load_plan(raw["launch"], partitions)
        except PlanError as e:
            problems.extend(f"{source}: {line}" for line in str(e).splitlines())
    if raw.get("inference") is not None:
        try:
            typed["inference"] = parse_inference(raw["inference"], 0, source="inference")
        except InferenceConfigError as e:
            problems.extend(f"{source}: {line}" for line in str(e).splitlines())
    for name, load, error in (("train", partial(load_train_config, check_paths=check_paths), TrainConfigError),
                              ("pool", load_pool_config, PoolConfigError),
                              ("eval", load_eval_config, EvalConfigError)):
        if raw.get(name) is not None:
            try:
                typed[name] = load(raw[name], source=name)
            except error as e:
                problems.extend(f"{source}: {line}" for line in str(e).splitlines())
    missing = [] if check_paths or "train" not in typed else \
        [f"{source}: train: {problem}" for problem in typed["train"].missing_paths()]
    if "pool" in typed and "train" in typed:
        try:
            typed["pool"].sampling(typed["train"].rollout_temperature)
        except PoolConfigError as e:
            problems.append(f"{source}: {e}")
    if "train" in typed:
        problems.extend(f"{source}: {problem}" for problem in
                        moe_problems(typed["train"], typed.get("pool"), typed.get("inference")))
    if problems:
        raise RunConfigError("\n".join(problems))
    return RunConfig(source=source, raw=raw, missing_paths=tuple(missing), **typed)


def model_moe_problems(train: TrainConfig) -> tuple[bool | None, list[str]]:
    """Whether the train model is a mixture of experts (None: its config.json is not there to read), and why
    it cannot be read."""
    config = train.model / "config.json"
    if not config.is_file():
        return None, []
    try:
        shape = routing.moe_shape(SimpleNamespace(**{"decoder_sparse_step": 1, "mlp_only_layers": (),
                                                      **json.loads(config.read_text())}))
    except (ValueError, AttributeError, TypeError) as e:
        return None, [f"train: {config} cannot be read as a model's config: {e}"]
    return shape is not None, []


def moe_problems(train: TrainConfig, pool: PoolConfig | None, inference: CpuServe | SGLangServe | None) -> list[str]:
    """Why a mixture of experts, or train.routing_replay, cannot work with these sections: replay of a model
    without MoE layers (when its config.json is there to read), a part of the path that would not carry the
    routes, an MoE split over the megatron backend's tensor-parallel ranks."""
    split = train.backend == "megatron" and train.megatron.tensor_parallel_size > 1
    if not (train.routing_replay or split):
        return []
    moe, problems = model_moe_problems(train)
    if moe and split:
        problems.append(moe_tensor_parallel_refusal(train.megatron.tensor_parallel_size))
    if not train.routing_replay:
        return problems
    if moe is False:
        problems.append(f"train.routing_replay: the model at {train.model} has no MoE layer (its config.json "
                        "names no num_experts and num_experts_per_tok): nothing to replay; set it to false")
    if pool is not None and not pool.adapter.return_routed_experts:
        problems.append("train.routing_replay needs pool.adapter.return_routed_experts: true (the adapter then asks "
                        "for each token's experts and keeps them in the samples)")
    if inference is not None and not inference.enable_return_routed_experts:
        problems.append("train.routing_replay needs inference.enable_return_routed_experts: true (the servers "
                        "then return each token's experts: SGLang's --enable-return-routed-experts)")
    return problems


def read_config_file(path: Path) -> Any:
    try:
        return read_yaml_file(path)
    except ConfigFileError as e:
        raise RunConfigError(str(e)) from None


def role_config(run_dir: Path | None, config: Path | None, *,
                overrides: dict[str, dict[str, Any]] | None = None) -> RunConfig:
    """A role's config: `--config FILE` (paths against its directory) if given, else the run's run.yaml.

    run.yaml holds the config `agentrl launch` resolved; an older one is resolved against the
    directory it records (RunLayout.config_base). `overrides` (a command line's options, section ->
    keys) replace keys of those sections before anything is checked; their paths are taken as given.
    """
    if config is not None:
        data, base, source = read_config_file(config), Path(config).resolve().parent, str(config)
    elif run_dir is not None and RunLayout.holds_run(Path(run_dir)):
        layout = RunLayout.open(run_dir)
        data, base, source = layout.manifest().config, layout.config_base(), str(layout.manifest_path)
    elif overrides:
        data, base, source = {}, Path.cwd(), "the command line"
    else:
        raise RunConfigError(f"{run_dir} is not a run directory (no run.yaml), and no --config was given (under "
                             "`agentrl launch` the run directory comes from AGENTRL_RUN_DIR)" if run_dir else
                             "no run directory and no --config: give one (under `agentrl launch` the run directory "
                             "comes from AGENTRL_RUN_DIR)")
    if overrides and isinstance(data, dict):
        data = {**data, **{name: {**(data.get(name) or {}), **keys} for name, keys in overrides.items()}}
    return load_run_config(data, base, source)



@dataclass(frozen=True)
class RoleContext:
    """What every role's command starts from: its launcher environment, its run directory, its config."""

    env: RoleEnv
    run_dir: Path
    config: RunConfig


def role_context(run_dir: Path | None, config: Path | None, *, how: str = "RUN_DIR",
                 overrides: dict[str, dict[str, Any]] | None = None) -> RoleContext:
    """A role's context: the run directory given (`how` names the argument), else the launcher's
    AGENTRL_RUN_DIR, and its config from `role_config`. RunConfigError says what is missing."""
    try:
        env = RoleEnv.from_environ()
    except ValueError as e:                      # a malformed AGENTRL_TASK_INDEX
        raise RunConfigError(str(e)) from None
    run_dir = run_dir if run_dir is not None else env.run_dir
    if run_dir is None:
        raise RunConfigError(f"no run directory: give {how} (or run it as a role of `agentrl launch`, which sets "
                             "AGENTRL_RUN_DIR)")
    return RoleContext(env, Path(run_dir), role_config(run_dir, config, overrides=overrides))

# -- continuing a run: what a relaunch may change --------------------------------------------------------

# What `agentrl launch CONFIG --run-dir EXISTING --accept-changes` may change: how long and on what the
# run goes on, not what it trains on or how (fnmatch patterns over dotted keys).
MAY_CHANGE = ("train.num_rollouts", "train.rollout_timeout_s", "train.publish_timeout_s", "train.evals_after_last",
              "train.tracking", "train.tracking.*", "launch.time_limit_min", "launch.checkpoint_grace_s",
              "launch.partitions", "launch.partitions.*", "launch.roles.*.restart", "launch.roles.*.restart.*",
              "launch.roles.*.env", "launch.roles.*.env.*", "launch.roles.*.partition", "launch.roles.*.nodes",
              "launch.roles.*.tasks", "launch.roles.*.cpus_per_task", "launch.roles.*.mem_per_task_mb",
              "pool.max_agents", "pool.max_booting", "pool.poll_s", "pool.scratch_dir", "pool.tools_dir",
              "eval", "eval.*", "inference.heartbeat_s", "inference.health_timeout_s")
NOT_COMPARED = ("config_dir", "run_dir")     # where the file and the run are, not what the run is


def config_changes(old: Any, new: Any, where: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every leaf that differs; a missing key is None."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            if not where and key in NOT_COMPARED:
                continue
            out += config_changes(old.get(key), new.get(key), f"{where}.{key}" if where else str(key))
        return out
    return [] if old == new else [(where, old, new)]


def refused_changes(changes: list[tuple[str, Any, Any]]) -> list[str]:
    """The changed keys a continued run may not take, even when asked to."""
    from fnmatch import fnmatchcase

    return [key for key, _, _ in changes if not any(fnmatchcase(key, p) for p in MAY_CHANGE)]


def describe_changes(changes: list[tuple[str, Any, Any]]) -> str:
    return "\n".join(f"  {key}: {old!r} -> {new!r}" for key, old, new in changes)
