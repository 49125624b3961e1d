"""A task as the pool, eval and `tasks check` use it: loaded from its record of the prompt data.

`load_record` turns one record (what `agentrl convert harbor` writes) into a LoadedTask: its spec,
the verifier's files, the reference solution, the host repository and the verifier's environment.
The record is untrusted: every payload path is checked and no payload inflates past MAX_FILE_BYTES;
`materialize` writes payload files under a directory and nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .task import TaskSpec, decode_payload

_SPEC_KEYS = ("instance_id", "image", "workdir", "eval_command", "timeouts", "resources", "base_commit",
              "reset_to_base_commit", "history", "files_to_exclude_from_patch")



@dataclass(frozen=True)
class LoadedTask:
    spec: TaskSpec
    tests: dict[str, bytes]
    solution: bytes | None
    testbed: dict[str, bytes] | None
    verifier_env: dict[str, str]


def decode_payloads(given: Any, where: str) -> dict[str, bytes]:
    """A record's payload files (path -> gzip + base64), each path checked and no file past MAX_FILE_BYTES."""
    from .task import MAX_FILE_BYTES, TaskSpecError, check_payload_path

    given = given or {}
    if not isinstance(given, dict):
        raise TaskSpecError(f"{where}: must be an object of path -> payload, got {type(given).__name__}")
    out = {}
    for rel, text in given.items():
        check_payload_path(rel, where)
        try:
            out[rel] = decode_payload(text, max_bytes=MAX_FILE_BYTES)
        except (ValueError, TypeError, EOFError) as e:
            raise TaskSpecError(f"{where}: {rel!r}: the payload {e} (a payload is gzip + base64 of at most "
                                f"{MAX_FILE_BYTES} bytes): convert the task again (`agentrl convert harbor`)") from None
    return out


def load_record(record: Mapping[str, Any]) -> LoadedTask:
    """A task from one record of the prompt data (what `agentrl convert harbor` writes).

    The record is untrusted: payload keys are written under a directory (the
    repository on the host, /tests in the sandbox), so each must be a relative
    path that stays there, and no payload may inflate past MAX_FILE_BYTES.
    """
    from .task import load_task_spec

    meta = record["metadata"]
    harbor = meta["harbor"]
    where = f"task {meta.get('instance_id')!r}: metadata.harbor"
    spec = load_task_spec({"prompt": record["prompt"], **{k: meta[k] for k in _SPEC_KEYS if k in meta}},
                          source=f"task {meta.get('instance_id')!r}")

    tests = {"test.sh": harbor["test_sh"].encode()}
    if harbor.get("config_json") is not None:
        tests["config.json"] = harbor["config_json"].encode()
    tests.update(decode_payloads(harbor.get("test_files"), f"{where}.test_files"))
    testbed = decode_payloads(harbor.get("testbed_files"), f"{where}.testbed_files") or None
    solve = harbor.get("solve_sh")
    return LoadedTask(spec, tests, solve.encode() if solve is not None else None, testbed,
                      dict(harbor.get("verifier_env") or {}))


def materialize(files: dict[str, bytes], into: Path, executable: Collection[str] | None = None,
                what: str = "testbed_files") -> Path:
    """Payload files (a host task's repository, an environment's build context) under `into`.

    Only under `into`: a key that is absolute, has '..' or is empty is refused
    (TaskSpecError), and so is one that resolves outside `into` through a
    symlink already there; the last component is never followed (O_NOFOLLOW).
    The files in `executable` (default: the *.sh ones) get mode 0755, the others 0644.
    """
    import os

    from .task import TaskSpecError, check_payload_path

    into = Path(into)
    for rel in files:
        check_payload_path(rel, f"{what} (materialized under {into})")
    into.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(into)
    for rel, data in files.items():
        path = into / rel
        parent = os.path.realpath(path.parent)  # checked before mkdir, which would follow a symlink out
        if os.path.commonpath([parent, root]) != root:
            raise TaskSpecError(f"{what}: key {rel!r} resolves to {parent}, outside {into} (through a "
                                f"symlink there): materialize into an empty directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.islink(path):
            raise TaskSpecError(f"{what}: key {rel!r}: {path} is a symlink, which would be written through: "
                                "materialize into an empty directory")
        mode = 0o755 if (rel in executable if executable is not None else rel.endswith(".sh")) else 0o644
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)     # the umask narrowed it
    return into


def load_task_records(paths: list[str] | list[Path]) -> list[dict[str, Any]]:
    """The prompt-data records of Harbor task directories (or directories of them) and JSONL prompt files."""
    from .harbor import convert_task, expand_task_dirs

    records, dirs = [], []
    for p in map(Path, paths):
        if p.suffix == ".jsonl":
            records += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        else:
            dirs.append(p)
    return records + [convert_task(d) for d in expand_task_dirs(dirs)]


def load_tasks(paths: list[str]) -> list[LoadedTask]:
    """Harbor task directories (or directories of them) and JSONL prompt files."""
    return [load_record(r) for r in load_task_records(paths)]
