"""The records of the rollout ledger (hpc.ledger): one small file each, validated on read."""

from __future__ import annotations

from typing import Any, Literal

from .records import Record

LAYOUT_VERSION = 1


class LedgerManifest(Record):
    kind: Literal["ledger"] = "ledger"
    layout: int = LAYOUT_VERSION


class GenerationRecord(Record):
    kind: Literal["generation"] = "generation"
    generation: int
    rollout_id: int


class OpeningRecord(Record):
    """rollouts/<r>/opening-<t>: try t at opening the rollout once (Ledger.open_once); mtime = its deadline."""
    kind: Literal["opening"] = "opening"
    rollout_id: int
    try_index: int


class RolloutSpec(Record):
    kind: Literal["rollout"] = "rollout"
    rollout_id: int
    generation: int
    groups: list[int]
    attempts: int
    max_tries: int
    opened: float
    # What the opener says each group is, for the workers to read and never recompute. Opaque here:
    # the application defines it (agentrl.prompts.groups); hpc knows nothing of prompts or sampling.
    payload: dict[str, Any] | None = None


class _AttemptRecord(Record):
    rollout_id: int
    generation: int
    group: int
    attempt: int
    try_index: int
    worker_id: str


class ClaimRecord(_AttemptRecord):
    kind: Literal["claim"] = "claim"
    lease_s: float


class FailRecord(_AttemptRecord):
    kind: Literal["fail"] = "fail"
    reason: str


class CommitRecord(_AttemptRecord):
    kind: Literal["commit"] = "commit"
    ref: str
    committed: float


class ClosedRecord(Record):
    kind: Literal["closed"] = "closed"
    rollout_id: int
    generation: int
    # The groups complete when the rollout closed: what is read from it (hpc.buffer.read_rollout), by
    # every reader alike, though attempts in flight may still commit. None in a ledger of older code.
    groups: list[int] | None = None
