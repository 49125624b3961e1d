"""The rollout ledger's state logic, free of I/O.

The ledger stores facts as files (hpc.ledger); this module turns one
observation of those facts into attempt states, claimable work and counts
(what `status()` reports, and the rule a claim follows), and keeps a claiming
worker's bookkeeping (`Fresh`, `Unfinished`): which attempts it tries next.

An attempt is one (group, attempt) pair of a rollout. Each claim of it is a
"try", numbered 0, 1, ... up to max_tries - 1. Only the newest try matters:
  committed  a commit exists (whichever try made it)
  claimed    the newest try is neither failed nor past its lease deadline
  pending    never claimed, or the newest try ended and another try is allowed
  failed     the newest try ended and it was the last one allowed
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

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

    @property
    def size(self) -> int:
        return len(self.groups) * self.attempts

    def key_at(self, i: int) -> Key:
        """The i-th of `keys()`, without listing them."""
        return self.groups[i // self.attempts], i % self.attempts

    @cached_property
    def names(self) -> tuple[str, ...]:
        """"<group>-<attempt>" of each of `keys()`, as the ledger's files name them."""
        return tuple(f"{g}-{a}" for g, a in self.keys())


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


def complete_groups(spec: Spec, commits: Iterable[Key]) -> list[int]:
    """The groups every attempt of which is committed."""
    done: dict[int, int] = {}
    for g, _a in set(commits):
        done[g] = done.get(g, 0) + 1
    return sorted(g for g in spec.groups if done.get(g, 0) >= spec.attempts)


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


# -- a claiming worker's bookkeeping ---------------------------------------------
# A claim must cost a bounded number of file-system calls however many attempts are out (on NFS or
# Lustre each is a round trip to a server the whole cluster shares), so a worker never reads every
# lease to claim one attempt: it takes attempts nobody claimed while there are any, and only then
# reads a few leases per claim, in turn.

PROBES = 8   # misses in a row before a worker lists the claims (again)
SAMPLE = 8   # leases a worker reads per claim in a rollout whose every attempt was claimed


def unclaimed(spec: Spec, claim_names: Iterable[str]) -> list[Key]:
    """The attempts of which no try was ever claimed, from the names of the claim files, "<g>-<a>-<try>"
    (no other name matches). Compares strings: a worker lists the claims often late in a rollout, and
    parsing every name would cost it several times more."""
    tried = {name.rpartition("-")[0] for name in claim_names}
    return [key for key, name in zip(spec.keys(), spec.names, strict=True) if name not in tried]


class Fresh:
    """Where one worker looks for a generation's never-claimed attempts.

    Until its first listing it guesses at random: while a rollout is young most attempts are
    unclaimed, so a guess costs one stat and usually hits, and workers rarely collide. After PROBES
    misses in a row it lists the claims and walks its own shuffled list, skipping what others took
    since; it lists again when the list runs dry or misses PROBES in a row (it is stale), except after
    a listing made in this call: then each miss is an attempt that another worker took meanwhile, and
    the list is walked out. A listing that finds nothing means that no attempt will be unclaimed
    again: `exhausted`.
    """

    def __init__(self, spec: Spec, rng: random.Random):
        self._spec, self._rng = spec, rng
        self._keys: list[Key] | None = None     # None: guessing, never listed
        self._misses = 0
        self._listed_now = False
        self.exhausted = False

    def start(self) -> None:
        """A claim call begins."""
        self._listed_now = False

    def next(self) -> Key | None:
        """The attempt to try next; None: list the claims first (then `listed`)."""
        if self._keys is None:
            if self._misses >= PROBES:
                return None
            return self._spec.key_at(self._rng.randrange(self._spec.size))
        if not self._keys or (self._misses >= PROBES and not self._listed_now):
            return None
        return self._keys.pop()

    def listed(self, keys: list[Key]) -> None:
        """What a listing found unclaimed (`unclaimed`)."""
        self._rng.shuffle(keys)
        self._keys, self._misses, self._listed_now = keys, 0, True
        self.exhausted = not keys

    def hit(self) -> None:
        self._misses = 0

    def miss(self) -> None:
        self._misses += 1


def open_claims(claim_names: Iterable[str], commit_names: Iterable[str]) -> list[str]:
    """The names of the claims of attempts without a commit: the others decide nothing. Compared as
    strings, "<g>-<a>-<try>" against "<g>-<a>", before any name is parsed."""
    committed = set(commit_names)
    return [name for name in claim_names if name.rpartition("-")[0] not in committed]


class Unfinished:
    """One worker's books of a generation once every attempt of it was claimed: the attempts not known
    to be committed or out of tries, each with the newest try the worker knows of.

    Built from one listing, it then learns only from the fails it lists and the few attempts it looks
    at per claim (`sample`, each in turn): a claim reads at most SAMPLE leases however many attempts
    are out, and an expired one is found within len/SAMPLE of this worker's claims that find nothing
    else (sooner across a pool, whose workers look in different orders).
    """

    def __init__(self, tries: Iterable[TryKey], rng: random.Random):
        """`tries`: those claimed of the attempts not committed when listed (`open_claims`)."""
        self.tries: dict[Key, int] = {}
        for g, a, t in tries:
            if t > self.tries.get((g, a), -1):
                self.tries[(g, a)] = t
        self._order = list(self.tries)
        rng.shuffle(self._order)
        self._next = 0

    def __len__(self) -> int:
        return len(self.tries)

    def failed(self, fails: Iterable[TryKey]) -> list[Key]:
        """The attempts whose newest try failed, from a listing of the fails. A fail may name a try
        newer than the one known: that try was claimed, so it is the newest now."""
        out: dict[Key, None] = {}
        for g, a, t in fails:
            known = self.tries.get((g, a))
            if known is not None and t >= known:
                self.tries[(g, a)] = t
                out[(g, a)] = None
        return list(out)

    def sample(self) -> Iterator[Key]:
        """The attempts, in a shuffled order that goes on from where the last sample stopped and comes
        round again only after all the others; each at most once."""
        if len(self._order) > 2 * len(self.tries):    # mostly dropped: compact, for O(1) amortized
            self._order = [key for key in self._order if key in self.tries]
            self._next = 0
        for _ in range(len(self._order)):
            key = self._order[self._next]
            self._next = (self._next + 1) % len(self._order)
            if key in self.tries:
                yield key

    def advance(self, key: Key, try_index: int) -> None:
        self.tries[key] = try_index

    def drop(self, key: Key) -> None:
        """Committed, or its last try ended: nothing more to claim of it."""
        self.tries.pop(key, None)
