"""The rollout ledger's state logic, free of I/O.

The ledger stores facts as files (hpc.ledger); this module turns one
observation of those facts into attempt states, claimable work and counts.

An attempt is one (group, attempt) pair of a rollout. Each claim of it is a
"try", numbered 0, 1, ... up to max_tries - 1. Only the newest try matters:
  committed  a commit exists (whichever try made it)
  claimed    the newest try is neither failed nor past its lease deadline
  pending    never claimed, or the newest try ended and another try is allowed
  failed     the newest try ended and it was the last one allowed
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

Key = tuple[int, int]            # (group, attempt)
TryKey = tuple[int, int, int]    # (group, attempt, try)


class State(str, Enum):
    PENDING = "pending"
    CLAIMED = "claimed"
    COMMITTED = "committed"
    FAILED = "failed"


@dataclass(frozen=True)
class Spec:
    groups: tuple[int, ...]
    attempts: int
    max_tries: int

    def keys(self) -> Iterable[Key]:
        return ((g, a) for g in self.groups for a in range(self.attempts))


@dataclass(frozen=True)
class Observation:
    """What the ledger's files said at one moment.

    `newest_try` maps each claimed attempt to its newest try; `deadlines` holds
    the lease deadline of those newest tries that are not failed (others may be
    missing: they are not needed to decide anything).
    """

    newest_try: Mapping[Key, int] = field(default_factory=dict)
    deadlines: Mapping[TryKey, float] = field(default_factory=dict)
    fails: frozenset[TryKey] = frozenset()
    commits: frozenset[Key] = frozenset()

    @classmethod
    def from_tries(cls, tries: Iterable[TryKey], deadlines: Mapping[TryKey, float],
                   fails: Iterable[TryKey], commits: Iterable[Key]) -> Observation:
        newest: dict[Key, int] = {}
        for g, a, t in tries:
            if t > newest.get((g, a), -1):
                newest[(g, a)] = t
        return cls(newest, dict(deadlines), frozenset(fails), frozenset(commits))


def needs_deadline(key: Key, obs: Observation) -> TryKey | None:
    """The try whose lease deadline decides `key`'s state, if any."""
    if key in obs.commits or key not in obs.newest_try:
        return None
    tk = (*key, obs.newest_try[key])
    return None if tk in obs.fails else tk


def attempt_state(key: Key, spec: Spec, obs: Observation, now: float) -> tuple[State, int]:
    """The state of one attempt and, when pending, the number of the next try."""
    if key in obs.commits:
        return State.COMMITTED, -1
    if key not in obs.newest_try:
        return State.PENDING, 0
    t = obs.newest_try[key]
    tk = (*key, t)
    ended = tk in obs.fails or obs.deadlines.get(tk, float("-inf")) <= now
    if not ended:
        return State.CLAIMED, t
    if t + 1 < spec.max_tries:
        return State.PENDING, t + 1
    return State.FAILED, t


def claimable(spec: Spec, obs: Observation, now: float) -> list[TryKey]:
    """Every (group, attempt, next try) that may be claimed now."""
    out = []
    for key in spec.keys():
        if key in obs.commits:
            continue  # the common case late in a rollout: decided without a call
        state, t = attempt_state(key, spec, obs, now)
        if state is State.PENDING:
            out.append((*key, t))
    return out


@dataclass(frozen=True)
class Counts:
    committed: int
    claimed: int
    pending: int
    failed: int
    complete_groups: list[int]


def summarize(spec: Spec, obs: Observation, now: float) -> Counts:
    counts = {s: 0 for s in State}
    incomplete: set[int] = set()
    for key in spec.keys():
        state, _ = attempt_state(key, spec, obs, now)
        counts[state] += 1
        if state is not State.COMMITTED:
            incomplete.add(key[0])
    return Counts(
        committed=counts[State.COMMITTED],
        claimed=counts[State.CLAIMED],
        pending=counts[State.PENDING],
        failed=counts[State.FAILED],
        complete_groups=sorted(set(spec.groups) - incomplete),
    )
