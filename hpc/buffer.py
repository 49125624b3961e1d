"""The sample buffer: one shard file per (rollout, group, attempt, try) on the shared filesystem.

A pool worker writes the shard of an attempt, then commits the claim with the
shard's path as its ref; the trainer reads only shards that the ledger says
are committed in the rollout's current generation, and only for complete groups.

A shard is a header (which try of which attempt wrote it, and who) and a list of
records, each a dict of msgpack values and numpy arrays. What a record means is
the application's: a `ShardCodec` turns its items into records and back. This
module knows arrays, not what they hold.

Format: msgpack; an array is an extension value of its dtype, shape and raw
little-endian bytes. msgpack is small (one C extension, no Arrow runtime), reads a
shard in one call, and keeps arrays exact (dtype and every bit); they come back as
read-only numpy views without a per-element decode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgpack
import numpy as np

from .environment import Writer
from .fsio import write_atomic
from .ledger import Claim, Ledger
from .records import RecordError

# 2: records are the application's, arrays are extension values (1 held hpc's own sample type).
SHARD_SCHEMA_VERSION = 2
_ARRAY_EXT = 1
# Fixed-size values whose bytes are the value (bool, integers, floats, complex): stored exactly.
_ARRAY_KINDS = "biufc"
_HEADER = ("rollout_id", "generation", "group", "attempt", "try_index")

T = TypeVar("T")


class ShardCodec(Protocol[T]):
    """How the application's items become shard records and back."""

    def to_record(self, item: T) -> dict[str, Any]:
        """The item as a dict of msgpack values (None, bool, int, float, str, bytes, lists, dicts) and arrays."""
        ...

    def from_record(self, record: dict[str, Any]) -> T:
        """The item a record holds; ValueError, TypeError or KeyError when it cannot be one."""
        ...

    def attempt_of(self, item: T) -> tuple[int, int]:
        """The (group, attempt) the item came from: a shard holds the items of its own attempt only."""
        ...


def _pack_array(value: object) -> msgpack.ExtType:
    """msgpack's `default` hook: a numpy array as an extension value; anything else msgpack lacks, refused."""
    if not isinstance(value, np.ndarray):
        raise TypeError(f"a shard record holds msgpack values and numpy arrays, not {type(value).__name__}")
    if value.dtype.kind not in _ARRAY_KINDS:
        raise TypeError(f"a shard cannot hold an array of dtype {value.dtype}: only bool, integer, float and "
                        "complex arrays are stored exactly")
    little = value.astype(value.dtype.newbyteorder("<"), copy=False)
    body = [little.dtype.str, list(value.shape), little.tobytes()]
    return msgpack.ExtType(_ARRAY_EXT, msgpack.packb(body, use_bin_type=True))


def _unpack_array(code: int, data: bytes) -> Any:
    """msgpack's `ext_hook`: an array back, as a read-only view of the shard's bytes."""
    if code != _ARRAY_EXT:
        return msgpack.ExtType(code, data)     # not ours: the codec refuses it, after the schema check
    dtype_name, shape, raw = msgpack.unpackb(data, raw=False)
    dtype = np.dtype(dtype_name)
    if dtype.kind not in _ARRAY_KINDS:
        raise ValueError(f"an array of dtype {dtype}, which a shard never holds")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def shard_path(buffer_dir: Path | str, claim: Claim) -> Path:
    """buffer/rollout_<r>/g<gen>/<group>-<attempt>-<try>.msgpack: unique per try, so tries never clash."""
    return (Path(buffer_dir) / f"rollout_{claim.rollout_id}" / f"g{claim.generation}"
            / f"{claim.group}-{claim.attempt}-{claim.try_index}.msgpack")


def write_shard(buffer_dir: Path | str, claim: Claim, items: list[T], codec: ShardCodec[T]) -> str:
    """Write the attempt's items atomically; returns the ref to commit (relative to buffer_dir)."""
    for item in items:
        group, attempt = codec.attempt_of(item)
        if (group, attempt) != (claim.group, claim.attempt):
            raise ValueError(f"an item of group {group} attempt {attempt} in the shard "
                             f"of group {claim.group} attempt {claim.attempt}")
    path = shard_path(buffer_dir, claim)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "kind": "shard", "schema_version": SHARD_SCHEMA_VERSION,
        "rollout_id": claim.rollout_id, "generation": claim.generation, "group": claim.group,
        "attempt": claim.attempt, "try_index": claim.try_index,
        "writer": Writer.current().model_dump(), "records": [codec.to_record(item) for item in items],
    }
    write_atomic(path, msgpack.packb(payload, use_bin_type=True, default=_pack_array))
    return str(path.relative_to(buffer_dir))


def read_shard(path: Path | str, codec: ShardCodec[T]) -> tuple[dict[str, Any], list[T]]:
    """The shard's header and items; RecordError naming the file if it cannot be trusted."""
    path = Path(path)
    try:
        d = msgpack.unpackb(path.read_bytes(), raw=False, ext_hook=_unpack_array)
    except FileNotFoundError:
        raise RecordError(path, "does not exist, though the ledger committed it",
                          "the buffer was moved or cleaned; restore it or reopen the rollout") from None
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise RecordError(path, f"is not a readable shard ({e})", "it is corrupt; reopen the rollout") from None
    if not isinstance(d, dict) or d.get("kind") != "shard":
        raise RecordError(path, "is not a sample shard")
    version = d.get("schema_version")
    if version != SHARD_SCHEMA_VERSION:
        older = isinstance(version, int) and version < SHARD_SCHEMA_VERSION
        raise RecordError(path, f"has shard schema {version!r}; this agentrl-hpc reads {SHARD_SCHEMA_VERSION}",
                          "an older agentrl-hpc wrote it: reopen the rollout so that its attempts are run again, "
                          "or read it with the version that wrote it" if older
                          else "read it with the version that wrote it")
    records = d.pop("records", None)
    if not isinstance(records, list):
        raise RecordError(path, "holds no list of records", "it is corrupt; reopen the rollout")
    items = []
    for i, record in enumerate(records):
        try:
            if not isinstance(record, dict):
                raise TypeError(f"a {type(record).__name__}, not a map")
            items.append(codec.from_record(record))
        except (TypeError, ValueError, KeyError) as e:
            raise RecordError(path, f"holds an invalid record at index {i} ({e})",
                              "it is corrupt or another application's; reopen the rollout") from None
    return d, items


def read_rollout(ledger: Ledger, buffer_dir: Path | str, rollout_id: int, codec: ShardCodec[T],
                 groups: list[int] | None = None) -> dict[int, list[T]]:
    """Items of the rollout's groups (current generation), by group index: of a closed rollout the
    groups its close fixed, so every reader trains on the same ones; of an open one, those complete now.

    Only shards that the ledger committed are read; a shard of another
    generation or attempt is refused, so no stale data is ever trained on.
    """
    status = ledger.status(rollout_id)
    closed = ledger.closed(rollout_id) if status.closed else None
    complete = set(status.complete_groups if closed is None or closed.groups is None else closed.groups)
    if groups is not None:
        complete &= set(groups)
    out: dict[int, list[T]] = {g: [] for g in sorted(complete)}
    for (g, a), commit in sorted(ledger.commits(rollout_id, complete).items()):
        path = Path(buffer_dir) / commit.ref
        header, items = read_shard(path, codec)
        expect = (rollout_id, status.generation, g, a, commit.try_index)
        found = tuple(header.get(k) for k in _HEADER)
        if found != expect:
            raise RecordError(path, f"is the shard of (rollout, generation, group, attempt, try) {found}, "
                              f"but the ledger committed {expect} to it")
        out[g].extend(items)
    return out
