"""The ledger's files, read: where each fact lives, and what the files say.

`LedgerView` finds a rollout's current generation, its spec, whether it is closed, its status and its
commits, from directory listings and a few stats (the layout is in hpc.ledger). It writes nothing, and
opens a ledger that exists: `Ledger` (hpc.ledger) is a LedgerView that also creates the ledger and
opens, claims, renews, commits and fails, and is the one to use for those.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

from .ledger_records import ClosedRecord, CommitRecord, RolloutSpec
from .ledger_state import Key, Observation, Spec, TryKey, complete_groups, needs_deadline, open_claims, summarize
from .records import parse_record, read_record

_GEN_DIR = re.compile(r"^g(\d+)$")


class LedgerError(Exception):
    """The ledger cannot be used as asked (bad input, unusable filesystem)."""


@dataclass(frozen=True)
class RolloutStatus:
    rollout_id: int
    generation: int
    closed: bool
    total: int
    committed: int
    claimed: int
    pending: int
    failed: int
    complete_groups: list[int]


@overload
def parse_names(names: list[str], n: Literal[3]) -> list[TryKey]: ...
@overload
def parse_names(names: list[str], n: Literal[2]) -> list[Key]: ...
def parse_names(names: list[str], n: int) -> list[Any]:
    """Keys from record names like "3-0-1"; skips temp files (".name.tmp-...") and strangers."""
    out = []
    for name in names:
        parts = name.split("-")
        if len(parts) == n and name[0] != "." and all(p.isdigit() for p in parts):
            out.append(tuple(map(int, parts)))
    return out


class LedgerView:
    """What a ledger rooted at `root` (RUN/ledger) holds, read; safe from many hosts at once."""

    def __init__(self, root: Path | str, *, clock: Callable[[], float] = time.time):
        self.root = Path(root).absolute()
        self._clock = clock
        self._specs: dict[Path, RolloutSpec] = {}

    @property
    def clock(self) -> Callable[[], float]:
        """The clock its leases are read (and, in a Ledger, written) against."""
        return self._clock

    # -- paths -----------------------------------------------------------------
    def _rollout_dir(self, rollout_id: int) -> Path:
        return self.root / "rollouts" / str(rollout_id)

    def _gen_dir(self, rollout_id: int, generation: int) -> Path:
        return self._rollout_dir(rollout_id) / f"g{generation}"

    def current_generation(self, rollout_id: int) -> int | None:
        try:
            names = os.listdir(self._rollout_dir(rollout_id))
        except FileNotFoundError:
            return None
        gens = [int(m.group(1)) for m in map(_GEN_DIR.match, names) if m]
        return max(gens) if gens else None

    def _current_dir(self, rollout_id: int) -> tuple[int, Path]:
        gen = self.current_generation(rollout_id)
        if gen is None:
            raise LedgerError(f"rollout {rollout_id} was never opened in {self.root}")
        return gen, self._gen_dir(rollout_id, gen)

    def _spec(self, gen_dir: Path) -> RolloutSpec:
        spec = self._specs.get(gen_dir)
        if spec is None:
            spec = self._specs[gen_dir] = read_record(gen_dir / "spec.json", RolloutSpec)
        return spec

    def _open_markers(self) -> list[tuple[int, int]]:
        out = []
        for name in os.listdir(self.root / "open"):
            rid, _, gen = name.partition("-g")
            if rid.isdigit() and gen.isdigit():
                out.append((int(rid), int(gen)))
        return out

    # -- reading -------------------------------------------------------------------
    def rollouts(self) -> list[int]:
        return sorted(int(n) for n in os.listdir(self.root / "rollouts") if n.isdigit())

    def spec(self, rollout_id: int, generation: int) -> RolloutSpec:
        """The spec (and payload) of one opening of a rollout."""
        gen_dir = self._gen_dir(rollout_id, generation)
        if not gen_dir.is_dir():
            raise LedgerError(f"rollout {rollout_id} generation {generation} does not exist in {self.root}")
        return self._spec(gen_dir)

    def closed(self, rollout_id: int) -> ClosedRecord | None:
        """The close record of the rollout's current generation, None while it is open (one open(2))."""
        _gen, gen_dir = self._current_dir(rollout_id)
        try:
            raw = (gen_dir / "closed").read_bytes()
        except FileNotFoundError:
            return None
        return parse_record(gen_dir / "closed", raw, ClosedRecord)

    def status(self, rollout_id: int) -> RolloutStatus:
        gen, gen_dir = self._current_dir(rollout_id)
        spec = self._spec(gen_dir)
        counts = summarize(self._state_spec(spec), self._observe(gen_dir), self._clock())
        return RolloutStatus(rollout_id, gen, (gen_dir / "closed").exists(),
                             len(spec.groups) * spec.attempts, counts.committed, counts.claimed,
                             counts.pending, counts.failed, counts.complete_groups)

    def complete_groups(self, rollout_id: int) -> list[int]:
        """The groups of the rollout's current generation whose every attempt is committed: one listing,
        where status() reads every lease (a poll for completion, cheap enough to make often)."""
        _gen, gen_dir = self._current_dir(rollout_id)
        spec = self._spec(gen_dir)
        return complete_groups(self._state_spec(spec), parse_names(os.listdir(gen_dir / "commits"), 2))

    def failures(self, rollout_id: int) -> int:
        """How many tries of the rollout's current generation failed (each retried, or the last one)."""
        _gen, gen_dir = self._current_dir(rollout_id)
        return len(parse_names(os.listdir(gen_dir / "fails"), 3))

    def commits(self, rollout_id: int, groups: Iterable[int] | None = None) -> dict[Key, CommitRecord]:
        """The commit records of the rollout's current generation (optionally of some groups)."""
        gen, gen_dir = self._current_dir(rollout_id)
        wanted = None if groups is None else set(groups)
        out = {}
        for g, a in parse_names(os.listdir(gen_dir / "commits"), 2):
            if wanted is None or g in wanted:
                out[(g, a)] = read_record(gen_dir / "commits" / f"{g}-{a}", CommitRecord)
        return out

    def _observe(self, gen_dir: Path) -> Observation:
        d = str(gen_dir)
        commit_names = os.listdir(d + "/commits")
        tries = parse_names(open_claims(os.listdir(d + "/claims"), commit_names), 3)
        fails = parse_names(os.listdir(d + "/fails"), 3)
        commits = parse_names(commit_names, 2)
        obs = Observation.from_tries(tries, {}, fails, commits)
        deadlines = {}
        for key in obs.newest_try:
            tk = needs_deadline(key, obs)
            if tk is not None:
                try:
                    deadlines[tk] = os.stat(f"{d}/claims/{tk[0]}-{tk[1]}-{tk[2]}").st_mtime
                except FileNotFoundError:
                    pass  # released by a close: counts as ended
        return Observation(obs.newest_try, deadlines, obs.fails, obs.commits)

    @staticmethod
    def _state_spec(spec: RolloutSpec) -> Spec:
        return Spec(tuple(spec.groups), spec.attempts, spec.max_tries)
