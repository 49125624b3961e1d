"""Schema-versioned records: JSON (or YAML) files validated on read.

Every record names its kind, its schema version and its writer. A reader
refuses what it cannot trust (truncated, corrupt, another kind, a newer schema)
with a RecordError that names the file and says what to do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .environment import Writer
from .fsio import read_bytes, write_atomic, write_new


class RecordError(Exception):
    """A record file that cannot be used; the message names the file."""

    def __init__(self, path: Path, problem: str, fix: str = ""):
        self.path = Path(path)
        msg = f"{path}: {problem}"
        super().__init__(f"{msg}. {fix}" if fix else msg)


class Record(BaseModel):
    """Base of every record. Subclasses set `kind` (a Literal) and `schema_version`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    schema_version: int = 1
    writer: Writer = Field(default_factory=Writer.current)



def _is_yaml(path: Path) -> bool:
    return path.suffix in (".yaml", ".yml")


def serialize(path: Path, record: Record) -> bytes:
    """JSON, or YAML for a .yaml path (for people to read, e.g. run.yaml)."""
    if _is_yaml(path):
        return yaml.safe_dump(record.model_dump(mode="json"), sort_keys=False).encode()
    return record.model_dump_json().encode()


R = TypeVar("R", bound=Record)


def _expected(cls: type[Record], name: str):
    return cls.model_fields[name].default


def parse_record(path: Path, raw: bytes, cls: type[R]) -> R:
    """Validate the bytes of `path` as a `cls` record."""
    if not raw.strip():
        raise RecordError(path, "is empty (truncated by an interrupted write)",
                          "agentrl never leaves one behind; remove it if it was copied in by hand")
    try:
        data = yaml.safe_load(raw) if _is_yaml(path) else json.loads(raw)
    except (ValueError, yaml.YAMLError) as e:
        raise RecordError(path, f"is not valid {'YAML' if _is_yaml(path) else 'JSON'} ({e})",
                          "the file is corrupt; restore it from a copy or remove it") from None
    if not isinstance(data, dict):
        raise RecordError(path, f"holds a {type(data).__name__}, not a record")
    kind, version = _expected(cls, "kind"), _expected(cls, "schema_version")
    if data.get("kind") != kind:
        raise RecordError(path, f"is a {data.get('kind')!r} record, expected {kind!r}")
    found = data.get("schema_version")
    if found != version:
        newer = isinstance(found, int) and found > version
        raise RecordError(
            path, f"has schema version {found!r}; this agentrl-hpc reads version {version}",
            "upgrade agentrl-hpc to read it" if newer else "it was written by an incompatible version")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise RecordError(path, f"is not a valid {kind} record:\n{e}") from None


def read_record(path: Path, cls: type[R]) -> R:
    path = Path(path)
    try:
        raw = read_bytes(path)
    except FileNotFoundError:
        raise RecordError(path, f"does not exist (expected a {_expected(cls, 'kind')} record)") from None
    return parse_record(path, raw, cls)


def write_record(path: Path, record: Record, *, fsync: bool = True) -> None:
    write_atomic(Path(path), serialize(Path(path), record), fsync=fsync)


def create_record(path: Path, record: Record, *, fsync: bool = True, mtime: float | None = None,
                  temp_dir: Path | None = None) -> bool:
    """Write `record` at `path` unless a file is there already; False if it was."""
    return write_new(Path(path), serialize(Path(path), record), fsync=fsync, mtime=mtime,
                     temp_dir=temp_dir)
