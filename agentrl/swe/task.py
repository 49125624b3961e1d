"""The SWE task spec, verifier payloads, and Harbor's reward rules.

A task is data: where the repository is (image, workdir), what the agent is
asked (prompt), and how the result is judged (eval_command, which writes a
reward the way Harbor verifiers do). Nothing here runs a sandbox.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import shlex
import zlib
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from hpc.validation import problems

HOST_IMAGE = "host"  # the host's own root filesystem, for the bundled tasks

# Payloads (test.sh, a SWE-bench config.json with hundreds of KB of test names)
# reach the sandbox on stdin of this command, never as argv or an inline
# heredoc: argv is capped by ARG_MAX (and a single argument by MAX_ARG_STRLEN,
# 128 KiB on Linux), and a heredoc inside a command line is still argv.
DECODE_COMMAND = "base64 -d | gunzip"

# The most one file of a task may hold: a file read by `agentrl convert harbor`,
# and a payload decoded from a JSONL line (so a small gzip cannot inflate to GBs).
MAX_FILE_BYTES = 16 * 2**20


# How much of the repository's git history the agent sees (agentrl.swe.history strips the rest at baseline):
# "ancestry", HEAD and its ancestors; "head", HEAD's commit alone (a shallow clone of depth 1); "keep", the
# image's .git as it is, whatever it holds beyond HEAD (the fix on a branch, a tag, a stash...).
History = Literal["ancestry", "head", "keep"]
# "head": ancestry's repack adds 0.6 s to a 1-2 s boot on a 3000-commit repository, head's 0.13 s
# (benchmarks/history_bench.py, docs/sandbox.md); a task that needs `git log` says history = "ancestry".
DEFAULT_HISTORY: History = "head"


class TaskSpecError(ValueError):
    """A task spec that cannot be used; the message names the source and the field."""


class Timeouts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    agent_s: float = Field(gt=0, allow_inf_nan=False)
    eval_s: float = Field(gt=0, allow_inf_nan=False)


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float = Field(default=1, gt=0, allow_inf_nan=False)
    mem_mb: int = Field(default=2048, gt=0)
    storage_mb: int | None = Field(default=None, gt=0)   # None: the scratch disk's own size
    pids: int = Field(default=1024, gt=0)                 # processes and threads


class TaskSpec(BaseModel):
    """One SWE task. `eval_command` as a str runs with `bash -c`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str = Field(min_length=1)
    image: str = Field(min_length=1)
    workdir: str
    prompt: str = Field(min_length=1)
    eval_command: list[str] | str
    timeouts: Timeouts
    resources: Resources = Field(default_factory=Resources)
    base_commit: str | None = None
    # Converted tasks start from the image as built; resetting would throw away
    # whatever the image's build put on top of base_commit.
    reset_to_base_commit: bool = False
    history: History = DEFAULT_HISTORY
    files_to_exclude_from_patch: list[str] = Field(default_factory=list)

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        parts = PurePosixPath(v).parts
        if not PurePosixPath(v).is_absolute():
            raise ValueError(f"must be an absolute path inside the sandbox, got {v!r}")
        if ".." in parts or "\0" in v:
            raise ValueError(f"must be an absolute path without '..' or NUL, got {v!r}")
        if len(parts) == 1:
            raise ValueError(f"must not be the root directory ({v!r}): put the repository in a directory "
                             "of its own, such as /testbed")
        return v

    @field_validator("eval_command")
    @classmethod
    def _non_empty(cls, v: list[str] | str) -> list[str] | str:
        if not v or (isinstance(v, str) and not v.strip()):
            raise ValueError("must name a command")
        return v

    @field_validator("reset_to_base_commit")
    @classmethod
    def _reset_needs_commit(cls, v: bool, info: ValidationInfo) -> bool:
        # a field validator (base_commit is validated first) so the error names this field
        if v and not info.data.get("base_commit"):
            raise ValueError("is true but base_commit is not set")
        return v

    def eval_argv(self) -> list[str]:
        if isinstance(self.eval_command, str):
            return ["bash", "-c", self.eval_command]
        return list(self.eval_command)


def load_task_spec(data: Any, source: str = "task") -> TaskSpec:
    """Validate `data` as a TaskSpec; errors read `source: field.path: problem`."""
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as e:
        raise TaskSpecError("\n".join(f"{source}: {field or '(task)'}: {msg}" for field, msg in problems(e))) from None


def payload_path_problem(rel: Any) -> str | None:
    """Why `rel` cannot name a payload file (a key of test_files / testbed_files), or None.

    A payload is written at DIR/rel (the repository on the host, /tests in the
    sandbox), so rel must stay under DIR: relative, no '..', in the canonical
    form the converter writes ('a/b', not 'a//b', 'a/./b' or 'a/').
    """
    if not isinstance(rel, str):
        return f"is a {type(rel).__name__}, not a path"
    if not rel:
        return "is empty"
    if "\0" in rel:
        return "contains a NUL byte"
    if rel.startswith("/"):
        return "is an absolute path"
    if ".." in rel.split("/"):
        return "has a '..' component"
    if PurePosixPath(rel).as_posix() != rel or "." in rel.split("/"):
        return f"is not in canonical form (write {PurePosixPath(rel).as_posix()!r})"
    return None


def check_payload_path(rel: Any, where: str) -> str:
    """`rel` if it is a safe relative payload path; else TaskSpecError naming `where` and the key."""
    problem = payload_path_problem(rel)
    if problem is not None:
        raise TaskSpecError(f"{where}: key {rel!r} {problem}: payload keys must be relative paths inside their "
                            "directory, such as 'src/app.py'; fix the task and convert it again "
                            "(`agentrl convert harbor`)")
    return rel


def encode_payload(data: bytes) -> str:
    """gzip + base64; mtime 0 so equal inputs give equal text (reproducible JSONL)."""
    return base64.b64encode(gzip.compress(data, mtime=0)).decode("ascii")


def decode_payload(text: str, max_bytes: int | None = None) -> bytes:
    """The payload's bytes; with `max_bytes`, ValueError rather than inflate past it."""
    raw = base64.b64decode(text, validate=True)
    if max_bytes is None:
        return gzip.decompress(raw)
    d = zlib.decompressobj(wbits=31)  # one gzip member, as encode_payload writes
    try:
        out = d.decompress(raw, max_bytes + 1)
    except zlib.error as e:
        raise ValueError(f"is not gzip data ({e})") from None
    if len(out) > max_bytes:
        raise ValueError(f"inflates to more than {max_bytes} bytes")
    if not d.eof:
        raise ValueError("is not a complete gzip stream")
    return out


def install_payload_argv(dest: str) -> list[str]:
    """The command that writes a payload fed on its stdin to `dest` in the sandbox."""
    return ["bash", "-c", f"{DECODE_COMMAND} > {shlex.quote(dest)}"]


class RewardError(ValueError):
    """A reward file that is there but cannot be read as a reward."""


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RewardError(f"{where}: {value!r} is not a number")
    if not math.isfinite(value):
        raise RewardError(f"{where}: {value!r} is not a finite number")
    return float(value)


def _from_txt(text: str) -> float:
    if not text.strip():
        raise RewardError("reward.txt is empty")
    try:
        value = float(text.strip())
    except ValueError:
        raise RewardError(f"reward.txt: {text.strip()[:80]!r} is not a number") from None
    return _number(value, "reward.txt")


def _from_json(text: str, reward_txt: str | None) -> float:
    if not text.strip():
        raise RewardError("reward.json is empty")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise RewardError(f"reward.json is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise RewardError(f"reward.json holds a {type(data).__name__}, expected an object like {{\"reward\": 1.0}}")
    if "reward" in data:
        return _number(data["reward"], "reward.json: reward")
    # Harbor keeps every numeric field and, without a "reward" key, takes the
    # scalar from reward.txt; a single numeric field is the reward itself.
    if reward_txt is not None:
        return _from_txt(reward_txt)
    numeric = {k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if len(numeric) == 1:
        (key, value), = numeric.items()
        return _number(value, f"reward.json: {key}")
    raise RewardError(f"reward.json has no \"reward\" key and {len(numeric)} numeric fields "
                      f"({', '.join(sorted(numeric)) or 'none'}): cannot tell which is the reward")


def reward_from(exit_code: int, reward_txt: str | None, reward_json: str | None) -> float:
    """Harbor's rule: reward.json wins over reward.txt; with neither, exit 0 -> 1.0, else 0.0.

    The arguments are the texts of /logs/verifier/reward.txt and reward.json
    (None when absent). A file that is present but malformed raises RewardError
    rather than silently scoring 0: a broken verifier must not look like a
    failed agent.
    """
    if reward_json is not None:
        return _from_json(reward_json, reward_txt)
    if reward_txt is not None:
        return _from_txt(reward_txt)
    return 1.0 if exit_code == 0 else 0.0
