"""Harbor task directories -> JSONL prompt data, one line per task.

A Harbor task is a directory: instruction.md (the prompt), task.toml (timeouts,
resources, image), environment/ (Dockerfile or a prebuilt image named in
task.toml), tests/test.sh (+ config.json and helpers) and solution/solve.sh.
Every file is read as bytes and decoded as strict UTF-8, so the prompt and the
verifier files travel byte for byte (CRLF kept). The output is reproducible:
sorted keys, tasks sorted by instance_id, no timestamps, gzip with mtime 0.

A task directory is untrusted input (it may come from a third-party data set):
every read goes through `TaskTree` (agentrl/swe/task_tree.py). Numbers must be
finite and the JSONL is strict JSON.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from hpc.fsio import write_atomic
from hpc.images.dockerfile import DOCKERFILE, DockerfileError, build_key, built_image_name, plan_dockerfile

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (setup.cfg allows it): the same parser, from PyPI
    import tomli as tomllib

from . import history
from .task import DEFAULT_HISTORY, HOST_IMAGE, TaskSpec, encode_payload
from .task_tree import HarborTaskError, TaskTree

TESTBED = "repo"        # a host task's repository: environment/repo/

# Eight tiny Harbor tasks shipped as package data: `agentrl convert harbor` and `agentrl tasks check` take this
# directory like any other (python -c "from agentrl.swe.harbor import BUNDLED_TASKS; print(BUNDLED_TASKS)").
BUNDLED_TASKS = Path(__file__).resolve().with_name("bundled_tasks")

# Where Harbor puts things inside the environment (harbor EnvironmentPaths):
# the verifier uploads tests/ to /tests and runs `bash /tests/test.sh`, which
# writes /logs/verifier/reward.txt or reward.json.
TESTS_DIR = "/tests"
VERIFIER_LOGS_DIR = "/logs/verifier"
EVAL_COMMAND = ["bash", f"{TESTS_DIR}/test.sh"]

# Harbor's defaults (harbor.models.task.config); the agent timeout has none.
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
DEFAULT_CPUS = 1
DEFAULT_MEMORY_MB = 2048

def _section(cfg: dict, name: str, path: Path) -> dict:
    value = cfg.get(name, {})
    if not isinstance(value, dict):
        raise HarborTaskError(path, f"[{name}] must be a table, got {type(value).__name__}")
    return value


def _positive(table: dict, section: str, key: str, path: Path, default: float | None) -> float:
    value = table.get(key, default)
    if value is None:
        raise HarborTaskError(path, f"[{section}] {key} is missing (seconds, a positive number)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise HarborTaskError(path, f"[{section}] {key} must be a finite positive number (seconds), got {value!r}")
    return float(value)


def _finite(table: dict, section: str, key: str, path: Path) -> None:
    """TOML has inf and nan; no count or size may be one (the JSONL must stay strict JSON)."""
    value = table.get(key)
    if isinstance(value, float) and not math.isfinite(value):
        raise HarborTaskError(path, f"[{section}] {key} must be a finite number, got {value!r}")


def _size_mb(text: str, path: Path, key: str = "memory") -> int:
    """Harbor's deprecated `memory = "2G"` / `storage = "10G"` spelling."""
    units = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    s = text.strip().upper()
    try:
        mb = float(s[:-1]) * units[s[-1:]]
        if not math.isfinite(mb):
            raise ValueError(s)
        return int(mb)
    except (KeyError, ValueError):
        raise HarborTaskError(path, f"[environment] {key} {text!r} is not a size like '2G' or '512M'") from None


def _executable(tree: TaskTree, path: Path) -> bool:
    real = tree.resolve(path)
    return real is not None and bool(os.stat(real).st_mode & 0o111)


def _environment_build(tree: TaskTree, env_dir: Path, files: dict[str, bytes], check: str | None) -> dict[str, Any]:
    """The task's environment/ (its files, the testbed's left out) as a build context: its key, its files
    (payloads), which are executable, and the check its image must pass."""
    executable = sorted(rel for rel in files if _executable(tree, env_dir / rel))
    return {"key": build_key(files, executable, check=check),
            "files": {rel: encode_payload(data) for rel, data in files.items()},
            "executable": executable, "check": check}


def _testbed(env: dict, toml_path: Path) -> str | None:
    """[environment] testbed (our extension): the directory under environment/ that holds the task's
    repository, which the JSONL carries and the sandbox puts at workdir, as a host task's environment/repo/."""
    testbed = env.get("testbed")
    if testbed is None:
        return None
    parts = PurePosixPath(testbed).parts if isinstance(testbed, str) else ()
    if not parts or PurePosixPath(testbed).is_absolute() or any(p in (".", "..") for p in parts):
        raise HarborTaskError(toml_path, f"[environment] testbed must name a directory under environment/, such as "
                                         f"'repo'; got {testbed!r}")
    return "/".join(parts)


def _image_and_workdir(env: dict, tree: TaskTree, toml_path: Path
                       ) -> tuple[str, str, dict[str, Any] | None, str | None]:
    """(image, workdir, the environment's build or None, the testbed directory or None) of a task.

    [environment] docker_image names a prebuilt image, used as it is (Harbor's rule too). Otherwise
    the Dockerfile's FROM is the image when the Dockerfile changes nothing (FROM, WORKDIR, metadata);
    when it does, the environment/ directory is the build context of an image that `agentrl images
    build` makes, named by its content. A testbed (a host task's environment/repo/, or the directory
    [environment] testbed names) is not part of the context: tasks of one project, whose repositories
    differ, share one build of what the repository needs.
    """
    env_dir = tree.dir / "environment"
    dockerfile = env_dir / DOCKERFILE
    plan = build = None
    image = env.get("docker_image")
    testbed = _testbed(env, toml_path) or (TESTBED if image == HOST_IMAGE else None)
    context = {rel: data for rel, data in tree.files_under(env_dir).items()
               if testbed is None or not rel.startswith(testbed + "/")} if tree.is_dir(env_dir) else {}
    if tree.exists(dockerfile):
        try:
            plan = plan_dockerfile(tree.read_text(dockerfile), context)
        except DockerfileError as e:
            if image is None:      # with a prebuilt image the Dockerfile is not built, as in Harbor
                note = (f" (environment/{testbed}/ is the testbed, [environment] testbed: not built into the image "
                        "but put at workdir when the sandbox starts)") if testbed and f"'{testbed}" in str(e) else ""
                raise HarborTaskError(dockerfile, str(e) + note) from None
    if image is None:
        if plan is None:
            raise HarborTaskError(toml_path, "no image: set [environment] docker_image "
                                             f"(or give {dockerfile} a FROM line)")
        if plan.needs_build:
            check = env.get("build_check")      # our extension, as workdir is
            if check is not None and (not isinstance(check, str) or not check.strip()):
                raise HarborTaskError(toml_path, "[environment] build_check must be a shell command that exits 0 in "
                                                 f"a good image, such as 'test -x /root/.local/bin/uv'; got {check!r}")
            build = _environment_build(tree, env_dir, context, check)
            image = built_image_name(build["key"])
        else:
            image = plan.bases[0]
    if not isinstance(image, str) or not image.strip():
        raise HarborTaskError(toml_path, f"[environment] docker_image must be an image reference, got {image!r}")
    # `workdir` is our extension (Harbor ignores keys it does not know); Harbor
    # itself takes the working directory from the image's WORKDIR.
    workdir = env.get("workdir", plan.workdir if plan else None)
    if workdir is None:
        raise HarborTaskError(toml_path, "no working directory: set [environment] workdir "
                                         f"(or a WORKDIR in {dockerfile})")
    if not isinstance(workdir, str) or not PurePosixPath(workdir).is_absolute():
        raise HarborTaskError(toml_path, f"[environment] workdir must be an absolute path, got {workdir!r}")
    return image, workdir, build, testbed


def parse_task_toml(text: str, task_dir: Path, toml_path: Path, tree: TaskTree | None = None) -> dict[str, Any]:
    """The parts of task.toml a TaskSpec needs, with Harbor's defaults."""
    tree = tree or TaskTree(task_dir)
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HarborTaskError(toml_path, f"is not valid TOML ({e})") from None
    agent, verifier = _section(cfg, "agent", toml_path), _section(cfg, "verifier", toml_path)
    env, meta = _section(cfg, "environment", toml_path), _section(cfg, "metadata", toml_path)
    image, workdir, build, testbed = _image_and_workdir(env, tree, toml_path)
    for key in ("cpus", "memory_mb", "storage_mb"):
        _finite(env, "environment", key, toml_path)
    memory_mb = env.get("memory_mb")
    if memory_mb is None:
        memory_mb = _size_mb(env["memory"], toml_path) if isinstance(env.get("memory"), str) else DEFAULT_MEMORY_MB
    # Harbor's storage_mb (older tasks: storage = "10G"); none: the node's scratch disk is the limit.
    storage_mb = env.get("storage_mb")
    if storage_mb is None and isinstance(env.get("storage"), str):
        storage_mb = _size_mb(env["storage"], toml_path, "storage")
    verifier_env = verifier.get("env", {})
    if not isinstance(verifier_env, dict) or not all(isinstance(v, str) for v in verifier_env.values()):
        raise HarborTaskError(toml_path, "[verifier] env must be a table of strings")
    base_commit = meta.get("base_commit")
    name = _section(cfg, "task", toml_path).get("name")
    if name is not None and not isinstance(name, str):
        raise HarborTaskError(toml_path, f"[task] name must be a string, got {name!r}")
    return {
        "image": image,
        "workdir": workdir,
        "environment_build": build,
        "testbed": testbed,
        "timeouts": {"agent_s": _positive(agent, "agent", "timeout_sec", toml_path, None),
                     "eval_s": _positive(verifier, "verifier", "timeout_sec", toml_path,
                                         DEFAULT_VERIFIER_TIMEOUT_S)},
        "resources": {"cpus": env.get("cpus", DEFAULT_CPUS), "mem_mb": memory_mb, "storage_mb": storage_mb},
        "base_commit": base_commit if isinstance(base_commit, str) else None,
        # agentrl keys in [metadata], which Harbor leaves free-form
        "reset_to_base_commit": meta.get("reset_to_base_commit", False),
        "history": meta.get("history", DEFAULT_HISTORY),
        "files_to_exclude_from_patch": meta.get("files_to_exclude_from_patch", []),
        "name": name,
        "verifier_env": dict(sorted(verifier_env.items())),
    }


def _payloads(tree: TaskTree, directory: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file under `directory` (relative path -> payload), binary ones too; no bytecode caches."""
    return {rel: encode_payload(data) for rel, data in tree.files_under(directory, skip).items()}


def _testbed_files(tree: TaskTree, testbed: str | None, image: str) -> dict[str, str] | None:
    """The repository that the sandbox puts at workdir: a "host" task's environment/repo/, or the directory
    [environment] testbed names.

    A host task has no image to carry its repository, and an image shared by tasks whose repositories
    differ carries none, so the JSONL line does: each line is then all a rollout worker needs, wherever
    the tasks/ tree is.
    """
    if testbed is None:
        return None
    repo = tree.dir / "environment" / testbed
    if not tree.is_dir(repo):
        why = (f"a task with docker_image = {HOST_IMAGE!r} brings its repository" if image == HOST_IMAGE
               else "[environment] testbed names it: add the repository there, or drop the key")
        raise HarborTaskError(repo, f"is missing: {why}")
    return _payloads(tree, repo)


def _validate(data: dict[str, Any], task_dir: Path, toml_path: Path) -> TaskSpec:
    """The TaskSpec; an error names the file and key it came from, which is what to edit."""
    sources = {
        "prompt": (task_dir / "instruction.md", "the instruction"),
        "image": (toml_path, "[environment] docker_image"),
        "workdir": (toml_path, "[environment] workdir"),
        "timeouts.agent_s": (toml_path, "[agent] timeout_sec"),
        "timeouts.eval_s": (toml_path, "[verifier] timeout_sec"),
        "resources.cpus": (toml_path, "[environment] cpus"),
        "resources.mem_mb": (toml_path, "[environment] memory_mb"),
        "resources.storage_mb": (toml_path, "[environment] storage_mb"),
        "base_commit": (toml_path, "[metadata] base_commit"),
        "reset_to_base_commit": (toml_path, "[metadata] reset_to_base_commit"),
        "history": (toml_path, "[metadata] history"),
        "files_to_exclude_from_patch": (toml_path, "[metadata] files_to_exclude_from_patch"),
    }
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field_ = ".".join(map(str, err["loc"]))
        path, key = sources.get(field_, (toml_path, field_))
        raise HarborTaskError(path, f"{key}: {err['msg'].removeprefix('Value error, ')}") from None


def convert_task(task_dir: Path) -> dict[str, Any]:
    """One JSONL record for a Harbor task directory."""
    task_dir = Path(task_dir)
    if not task_dir.is_dir():
        raise HarborTaskError(task_dir, "is not a directory")
    tree = TaskTree(task_dir)
    instruction = tree.read_text(task_dir / "instruction.md")
    toml_path = task_dir / "task.toml"
    parsed = parse_task_toml(tree.read_text(toml_path), task_dir, toml_path, tree)
    tests_dir = task_dir / "tests"
    test_sh = tree.read_text(tests_dir / "test.sh")
    config_json = tree.read_text(tests_dir / "config.json") if tree.exists(tests_dir / "config.json") else None
    solve = task_dir / "solution" / "solve.sh"
    spec_data = {
        "instance_id": task_dir.resolve().name,
        "prompt": instruction,
        "eval_command": EVAL_COMMAND,
        **{k: parsed[k] for k in ("image", "workdir", "timeouts", "resources", "base_commit",
                                  "reset_to_base_commit", "history", "files_to_exclude_from_patch")},
    }
    spec = _validate(spec_data, task_dir, toml_path)
    metadata = spec.model_dump(mode="json", exclude={"prompt"})
    metadata["problem_statement"] = instruction
    metadata["harbor"] = {
        "config_json": config_json,
        "test_sh": test_sh,
        "test_files": _payloads(tree, tests_dir, skip=("test.sh", "config.json")),
        "testbed_files": _testbed_files(tree, parsed["testbed"], spec.image),
        "environment_build": parsed["environment_build"],
        "solve_sh": tree.read_text(solve) if tree.exists(solve) else None,
        "name": parsed["name"],
        "verifier_env": parsed["verifier_env"],
        "tests_dir": TESTS_DIR,
        "logs_dir": VERIFIER_LOGS_DIR,
    }
    return {"prompt": instruction, "metadata": metadata}


def expand_task_dirs(paths: list[Path]) -> list[Path]:
    """Task directories as given; a directory of task directories (a dataset) stands for its tasks,
    but not its hidden ones (a generator's unfinished `.NAME.tmp-*`, an editor's, git's)."""
    out = []
    for p in map(Path, paths):
        is_task = (p / "task.toml").exists() or (p / "instruction.md").exists()
        children = [] if is_task or not p.is_dir() else sorted(
            c for c in p.iterdir()
            if not c.name.startswith(".") and ((c / "task.toml").exists() or (c / "instruction.md").exists()))
        out.extend(children or [p])
    return out


@dataclass
class Conversion:
    records: list[dict[str, Any]] = field(default_factory=list)
    errors: list[HarborTaskError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)    # history beyond HEAD in a task's repository


def convert_tasks(paths: list[Path]) -> Conversion:
    """Convert every task; bad ones land in `errors`, named by path. Records sorted by instance_id."""
    result = Conversion()
    seen: dict[str, Path] = {}
    for task_dir in expand_task_dirs(paths):
        try:
            rec = convert_task(task_dir)
            iid = rec["metadata"]["instance_id"]
            if iid in seen:
                raise HarborTaskError(task_dir, f"instance_id {iid!r} is also the name of {seen[iid]}")
        except HarborTaskError as e:
            result.errors.append(e)
            continue
        seen[iid] = task_dir
        result.records.append(rec)
        result.warnings += history.task_warnings(task_dir, iid, rec["metadata"]["history"])
    result.records.sort(key=lambda r: r["metadata"]["instance_id"])
    return result


def render_jsonl(records: list[dict[str, Any]]) -> bytes:
    # ensure_ascii: a raw U+2028 inside a JSON line is valid JSON but splits the
    # line for readers that use str.splitlines; escapes keep one task per line.
    # allow_nan=False: NaN/Infinity are not JSON; a non-finite number raises here, never lands in the file.
    return b"".join(json.dumps(r, sort_keys=True, ensure_ascii=True, allow_nan=False).encode("ascii") + b"\n"
                    for r in records)


def write_prompts(paths: list[Path], out: Path, on_error: str = "fail") -> Conversion:
    """Convert and write `out` atomically. With on_error="fail", any bad task writes nothing."""
    if on_error not in ("skip", "fail"):
        raise ValueError(f"on_error must be 'skip' or 'fail', got {on_error!r}")
    result = convert_tasks(paths)
    if result.errors and on_error == "fail":
        return result
    write_atomic(Path(out), render_jsonl(result.records))
    return result
