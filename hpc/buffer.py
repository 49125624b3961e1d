"""The sample buffer: one shard file per (rollout, group, attempt, try) on the shared filesystem.

A pool worker writes the shard of an attempt, then commits the claim with the
shard's path as its ref; the trainer reads only shards that the ledger says
are committed in the rollout's current generation, and only for complete groups.

Format: msgpack, with each array stored as raw little-endian bytes plus its
dtype. msgpack is small (one C extension, no Arrow runtime), reads a shard in
one call, and keeps token ids exact; the arrays come back as numpy views
without a per-element decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from .environment import Writer
from .fsio import write_atomic
from .ledger import Claim, Ledger
from .records import RecordError

SHARD_SCHEMA_VERSION = 1

_ARRAYS = {"tokens": np.int32, "loss_mask": np.uint8, "rollout_log_probs": np.float32}


@dataclass
class Sample:
    """One training sample: prompt + response tokens, and per-response-token mask and logprobs."""

    tokens: np.ndarray
    response_length: int
    loss_mask: np.ndarray
    rollout_log_probs: np.ndarray
    reward: float
    status: str
    group_index: int
    attempt: int
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, dtype in _ARRAYS.items():
            setattr(self, name, np.asarray(getattr(self, name), dtype=dtype))
        problems = []
        if self.tokens.ndim != 1:
            problems.append("tokens must be 1-D")
        if not 0 <= self.response_length <= len(self.tokens):
            problems.append(f"response_length {self.response_length} is outside 0..{len(self.tokens)}")
        for name in ("loss_mask", "rollout_log_probs"):
            if len(getattr(self, name)) != self.response_length:
                problems.append(f"{name} has {len(getattr(self, name))} entries, "
                                f"response_length is {self.response_length}")
        if problems:
            raise ValueError("invalid sample: " + "; ".join(problems))


def _encode(sample: Sample) -> dict:
    out = {k: v for k, v in vars(sample).items() if k not in _ARRAYS}
    for name in _ARRAYS:
        out[name] = getattr(sample, name).astype(getattr(sample, name).dtype.newbyteorder("<")).tobytes()
    return out


def _decode(d: dict) -> Sample:
    arrays = {name: np.frombuffer(d.pop(name), dtype=np.dtype(dtype).newbyteorder("<"))
              for name, dtype in _ARRAYS.items()}
    return Sample(**arrays, **d)


def shard_path(buffer_dir: Path, claim: Claim) -> Path:
    """buffer/rollout_<r>/g<gen>/<group>-<attempt>-<try>.msgpack: unique per try, so tries never clash."""
    return (Path(buffer_dir) / f"rollout_{claim.rollout_id}" / f"g{claim.generation}"
            / f"{claim.group}-{claim.attempt}-{claim.try_index}.msgpack")


def write_shard(buffer_dir: Path, claim: Claim, samples: list[Sample]) -> str:
    """Write the attempt's samples atomically; returns the ref to commit (relative to buffer_dir)."""
    for s in samples:
        if (s.group_index, s.attempt) != (claim.group, claim.attempt):
            raise ValueError(f"sample of group {s.group_index} attempt {s.attempt} in the shard "
                             f"of group {claim.group} attempt {claim.attempt}")
    path = shard_path(buffer_dir, claim)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "kind": "shard", "schema_version": SHARD_SCHEMA_VERSION,
        "rollout_id": claim.rollout_id, "generation": claim.generation, "group": claim.group,
        "attempt": claim.attempt, "try_index": claim.try_index,
        "writer": Writer.current().model_dump(), "samples": [_encode(s) for s in samples],
    }
    write_atomic(path, msgpack.packb(payload, use_bin_type=True))
    return str(path.relative_to(buffer_dir))


def read_shard(path: Path) -> tuple[dict, list[Sample]]:
    """The shard's header and samples; RecordError naming the file if it cannot be trusted."""
    path = Path(path)
    try:
        d = msgpack.unpackb(path.read_bytes(), raw=False)
    except FileNotFoundError:
        raise RecordError(path, "does not exist, though the ledger committed it",
                          "the buffer was moved or cleaned; restore it or reopen the rollout") from None
    except (ValueError, msgpack.UnpackException) as e:
        raise RecordError(path, f"is not a readable shard ({e})", "it is corrupt; reopen the rollout") from None
    if not isinstance(d, dict) or d.get("kind") != "shard":
        raise RecordError(path, "is not a sample shard")
    if d.get("schema_version") != SHARD_SCHEMA_VERSION:
        raise RecordError(path, f"has shard schema {d.get('schema_version')!r}; this agentrl-hpc reads "
                          f"{SHARD_SCHEMA_VERSION}", "read it with the version that wrote it")
    try:
        samples = [_decode(s) for s in d.pop("samples")]
    except (TypeError, ValueError, KeyError) as e:
        raise RecordError(path, f"holds an invalid sample ({e})") from None
    return d, samples


def read_rollout(ledger: Ledger, buffer_dir: Path, rollout_id: int,
                 groups: list[int] | None = None) -> dict[int, list[Sample]]:
    """Samples of the rollout's groups (current generation), by group index: of a closed rollout the
    groups its close fixed, so every reader trains on the same ones; of an open one, those complete now.

    Only shards that the ledger committed are read; a shard of another
    generation or attempt is refused, so no stale data is ever trained on.
    """
    status = ledger.status(rollout_id)
    closed = ledger.closed(rollout_id) if status.closed else None
    complete = set(status.complete_groups if closed is None or closed.groups is None else closed.groups)
    if groups is not None:
        complete &= set(groups)
    out: dict[int, list[Sample]] = {g: [] for g in sorted(complete)}
    for (g, a), commit in sorted(ledger.commits(rollout_id, complete).items()):
        path = Path(buffer_dir) / commit.ref
        header, samples = read_shard(path)
        expect = (rollout_id, status.generation, g, a, commit.try_index)
        found = tuple(header.get(k) for k in ("rollout_id", "generation", "group", "attempt", "try_index"))
        if found != expect:
            raise RecordError(path, f"is the shard of (rollout, generation, group, attempt, try) {found}, "
                              f"but the ledger committed {expect} to it")
        out[g].extend(samples)
    return out
