"""The rollout ledger: which (rollout, group, attempt) is claimed by whom, done, failed.

Correct on NFS by construction: every fact is its own small file, created once
by link(2) (atomic and exclusive on every POSIX shared filesystem, unlike flock
or O_APPEND), so no two writers ever touch the same file and no lock is held.

    ledger/
      ledger.json                   layout version
      generations/<n>               one file per generation handed out (fencing tokens)
      open/<rollout>-g<gen>         index of rollouts that may hand out claims
      rollouts/<rollout>/opening-<t>  try t at opening it once (open_once), mtime = its deadline
      rollouts/<rollout>/g<gen>/    one directory per opening of a rollout
        spec.json                   groups, attempts, max_tries, the opener's payload
        closed                      present once the rollout is closed: the groups it holds
        claims/<group>-<attempt>-<try>    mtime = lease deadline, renewed by heartbeat
        fails/<group>-<attempt>-<try>     that try gave up
        commits/<group>-<attempt>         the result (ref), never replaced

The newest g<gen> of a rollout is its current generation; anything written
under an older one is dropped. State logic lives in hpc.ledger_state; reading the
files in hpc.ledger_view (LedgerView, which Ledger extends with every write).

A claim costs a bounded number of file-system calls however many attempts are out
(each is a round trip to the server on NFS or Lustre): a worker takes attempts
nobody claimed, guessed at random and then from its own listing, while there are
any; after that it reads the leases of SAMPLE attempts per claim, in turn, to find
the expired ones, and lists the fails for the failed ones. It never reads every
lease: only `status()` (the trainer's) does.
"""

from __future__ import annotations

import os
import random
import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path
from typing import Any, Literal

from .fsio import fsync_dir, probe_links, temp_path
from .ledger_records import (
    LAYOUT_VERSION,
    ClaimRecord,
    ClosedRecord,
    CommitRecord,
    FailRecord,
    GenerationRecord,
    LedgerManifest,
    OpeningRecord,
    RolloutSpec,
)
from .ledger_state import SAMPLE, Fresh, Spec, Unfinished, open_claims, unclaimed
from .ledger_view import LedgerError, LedgerView, RolloutStatus, parse_names
from .records import create_record, read_record, write_record

__all__ = ["DEFAULT_MAX_TRIES", "Claim", "LeaseLost", "Ledger", "LedgerError", "LedgerView", "RolloutStatus",
           "StaleGeneration"]

DEFAULT_MAX_TRIES = 3
_Miss = Literal["taken", "closed", "committed"]     # why a try could not be claimed (Ledger._take)
_WORKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")


class StaleGeneration(Exception):
    """The claim belongs to a generation that a newer opening of its rollout superseded."""


class LeaseLost(StaleGeneration):
    """The claim's lease expired and another worker took the attempt over (or it was failed)."""


# -- public values -----------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    rollout_id: int
    group: int
    attempt: int
    generation: int
    try_index: int = 0
    worker_id: str = ""
    lease_s: float = 60.0


@dataclass
class _Seen:
    """What one worker knows of an open generation; hpc.ledger_state keeps the books."""
    state: Spec
    fresh: Fresh
    left: Unfinished | None = None     # once a listing found every attempt claimed


def _check_index(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LedgerError(f"{name} must be a non-negative integer, got {value!r}")
    return value


class Ledger(LedgerView):
    """A rollout ledger rooted at `root` (RUN/ledger). Safe to use from many hosts at once.

    Its reads (status, commits, spec, closed, ...) are LedgerView's; every write is here.
    """

    def __init__(self, root: Path | str, *, clock: Callable[[], float] = time.time,
                 seed: int | None = None):
        super().__init__(root, clock=clock)
        self._rng = random.Random(seed)
        self._seen: dict[Path, _Seen] = {}        # what this worker knows of each open generation
        self._temp_dirs: dict[int, Path] = {}
        for sub in ("generations", "open", "rollouts", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        try:
            probe_links(self.root)
        except OSError as e:
            raise LedgerError(
                f"{self.root}: this filesystem cannot create files exclusively with link(2) ({e}); "
                "the ledger needs it to stay correct across hosts. Put the run directory on a "
                "POSIX shared filesystem (NFSv3+, Lustre, GPFS, BeeGFS) or a local disk.") from None
        manifest = self.root / "ledger.json"
        if not manifest.exists():
            create_record(manifest, LedgerManifest())
        found = read_record(manifest, LedgerManifest)
        if found.layout != LAYOUT_VERSION:
            raise LedgerError(f"{manifest}: ledger layout {found.layout}, this agentrl-hpc reads "
                              f"{LAYOUT_VERSION}; use the agentrl-hpc version that wrote it")

    # -- paths -----------------------------------------------------------------
    def _temp_dir(self) -> Path:
        """This process's own directory for temp files (per pid: a forked child is another writer)."""
        pid = os.getpid()
        if pid not in self._temp_dirs:
            d = self.root / "tmp" / f"{socket.gethostname()}-{pid}"
            d.mkdir(exist_ok=True)
            self._temp_dirs[pid] = d
        return self._temp_dirs[pid]

    def _require_current(self, c: Claim) -> Path:
        if self.current_generation(c.rollout_id) != c.generation:
            raise StaleGeneration(
                f"rollout {c.rollout_id} generation {c.generation} was superseded; drop this work")
        return self._gen_dir(c.rollout_id, c.generation)

    # -- trainer side ----------------------------------------------------------
    def open_rollout(self, rollout_id: int, groups: Sequence[int], attempts: int,
                     max_tries: int = DEFAULT_MAX_TRIES, payload: Mapping[str, Any] | None = None) -> int:
        """Open (or reopen) a rollout; returns its new generation, newer than any before.

        `payload` (JSON) is kept in the spec for workers to read (`spec()`); the ledger never looks in it.
        """
        _check_index("rollout_id", rollout_id)
        groups = [_check_index("group index", g) for g in groups]
        if not groups or len(set(groups)) != len(groups):
            raise LedgerError(f"groups must be a non-empty list of distinct indices, got {groups!r}")
        if _check_index("attempts", attempts) < 1 or _check_index("max_tries", max_tries) < 1:
            raise LedgerError("attempts and max_tries must be at least 1")
        gen = self._allocate_generation(rollout_id)
        rdir = self._rollout_dir(rollout_id)
        rdir.mkdir(parents=True, exist_ok=True)
        # Build the generation directory aside and rename it in, so it appears complete.
        tmp = temp_path(rdir / f"g{gen}")
        for sub in ("claims", "fails", "commits"):
            (tmp / sub).mkdir(parents=True)
        write_record(tmp / "spec.json", RolloutSpec(
            rollout_id=rollout_id, generation=gen, groups=groups, attempts=attempts,
            max_tries=max_tries, opened=self._clock(), payload=None if payload is None else dict(payload)))
        os.rename(tmp, rdir / f"g{gen}")
        fsync_dir(rdir)
        create_record(self.root / "open" / f"{rollout_id}-g{gen}", GenerationRecord(
            generation=gen, rollout_id=rollout_id))
        self._drop_open_markers(rollout_id, below=gen)
        return gen

    def open_once(self, rollout_id: int, groups: Sequence[int], attempts: int, max_tries: int = DEFAULT_MAX_TRIES,
                  payload: Mapping[str, Any] | None = None, *, opening_s: float = 30.0,
                  sleep: Callable[[float], None] = time.sleep) -> RolloutSpec:
        """Open the rollout unless it is open: whoever comes first opens it, and every caller gets the
        spec of the one generation (compare its payload with yours). Reopening would supersede the
        others' claims, so it never happens here.

        The opener holds `rollouts/<r>/opening-<t>` for `opening_s` (its mtime, as a claim's lease):
        if it dies before the generation appears, the next caller takes try t+1 after that, so
        nobody waits longer than `opening_s` for a dead opener.
        """
        rdir = self._rollout_dir(_check_index("rollout_id", rollout_id))
        rdir.mkdir(parents=True, exist_ok=True)
        t = 0
        while (gen := self.current_generation(rollout_id)) is None:
            marker = rdir / f"opening-{t}"
            if create_record(marker, OpeningRecord(rollout_id=rollout_id, try_index=t),
                             mtime=self._clock() + opening_s, temp_dir=self._temp_dir()):
                self.open_rollout(rollout_id, groups, attempts, max_tries, payload)
                continue         # the newest generation: a late dead opener's may have landed meanwhile
            try:
                expired = os.stat(marker).st_mtime <= self._clock()
            except FileNotFoundError:
                expired = False
            if expired:
                t += 1
            else:
                sleep(0.05)
        return self.spec(rollout_id, gen)

    def _allocate_generation(self, rollout_id: int) -> int:
        gdir = self.root / "generations"
        while True:
            taken = [int(n) for n in os.listdir(gdir) if n.isdigit()]
            gen = max(taken, default=0) + 1
            if create_record(gdir / str(gen), GenerationRecord(generation=gen, rollout_id=rollout_id)):
                return gen

    def _drop_open_markers(self, rollout_id: int, below: int) -> None:
        for rid, gen in self._open_markers():
            if rid == rollout_id and gen < below:
                try:
                    os.unlink(self.root / "open" / f"{rid}-g{gen}")
                except FileNotFoundError:
                    pass

    def close_rollout(self, rollout_id: int) -> ClosedRecord:
        """Stop handing out claims and fix the rollout's groups: those complete now.

        Claims in flight may still commit, but what the rollout holds is decided once, by whoever
        closes it first: a repeated close (a resumed trainer) returns the first one's record.
        """
        gen, gen_dir = self._current_dir(rollout_id)
        closed = ClosedRecord(rollout_id=rollout_id, generation=gen, groups=self.status(rollout_id).complete_groups)
        if not create_record(gen_dir / "closed", closed):
            closed = read_record(gen_dir / "closed", ClosedRecord)
        self._drop_open_markers(rollout_id, below=gen + 1)
        return closed

    # -- worker side -------------------------------------------------------------
    def claim(self, worker_id: str, lease_s: float = 60.0, rollout_id: int | None = None,
              check: Callable[[RolloutSpec], None] | None = None) -> Claim | None:
        """Claim one attempt of an open rollout (the oldest first), or None if none is claimable: with
        more than SAMPLE attempts unfinished in a rollout, none found among the leases this call read.

        `check(spec)` runs before anything of a rollout is claimed; what it raises propagates and
        nothing is claimed (a worker that cannot do a rollout's work refuses it without costing a try).
        """
        if not _WORKER_ID.match(worker_id or ""):
            raise LedgerError(f"worker_id {worker_id!r}: use letters, digits and . _ : @ - (at most 128)")
        if not lease_s > 0:
            raise LedgerError(f"lease_s must be positive, got {lease_s!r}")
        newest: dict[int, int] = {}
        for rid, gen in self._open_markers():
            newest[rid] = max(gen, newest.get(rid, gen))
        open_dirs = {self._gen_dir(rid, gen) for rid, gen in newest.items()}
        for gone in self._seen.keys() - open_dirs:
            del self._seen[gone]       # closed or superseded: what this worker knew of it is of no use
        for rid in sorted(newest):
            if rollout_id is not None and rid != rollout_id:
                continue
            gen_dir = self._gen_dir(rid, newest[rid])
            if (gen_dir / "closed").exists():
                continue
            spec = self._spec(gen_dir)
            if check is not None:
                check(spec)
            c = self._claim_in(gen_dir, spec, worker_id, lease_s)
            if c is not None:
                return c
        return None

    def _claim_in(self, gen_dir: Path, spec: RolloutSpec, worker_id: str, lease_s: float) -> Claim | None:
        # A bounded number of calls, however many attempts are out (hpc.ledger_state, "a claiming
        # worker's bookkeeping"): never-claimed attempts first, and once there are none left, the
        # attempts whose newest try failed and SAMPLE others' leases.
        seen = self._seen.get(gen_dir)
        if seen is None:
            state = self._state_spec(spec)
            seen = self._seen[gen_dir] = _Seen(state, Fresh(state, self._rng))

        def take(g: int, a: int, t: int) -> Claim | _Miss:
            return self._take(gen_dir, spec, g, a, t, worker_id, lease_s)

        fresh = seen.fresh
        fresh.start()
        while not fresh.exhausted:
            key = fresh.next()
            if key is None:
                names = os.listdir(gen_dir / "claims")
                fresh.listed(unclaimed(seen.state, names))
                if fresh.exhausted:
                    tries = parse_names(open_claims(names, os.listdir(gen_dir / "commits")), 3)
                    seen.left = Unfinished(tries, self._rng)
                continue
            got = take(*key, 0)
            if isinstance(got, Claim):
                fresh.hit()
                return got
            if got == "closed":
                return None
            fresh.miss()
        assert seen.left is not None, "a worker that found every attempt claimed keeps its books"
        return self._retry(gen_dir, seen.left, spec.max_tries, take)

    def _retry(self, gen_dir: Path, left: Unfinished, max_tries: int,
               take: Callable[[int, int, int], Claim | _Miss]) -> Claim | None:
        """A next try of an attempt whose newest try ended: failed (the fails are listed), or its lease
        expired (read for SAMPLE attempts, in turn)."""
        if not left:
            return None
        d = str(gen_dir)
        fails = set(parse_names(os.listdir(d + "/fails"), 3))
        now = self._clock()
        for key in chain(left.failed(fails), islice(left.sample(), SAMPLE)):
            g, a = key
            while key in left.tries:
                t = left.tries[key]
                if (g, a, t) not in fails:
                    try:
                        if os.stat(f"{d}/claims/{g}-{a}-{t}").st_mtime > now:
                            break              # held: its lease runs
                    except FileNotFoundError:
                        pass                   # withdrawn by a close: ended
                if os.path.lexists(f"{d}/commits/{g}-{a}") or t + 1 >= max_tries:
                    left.drop(key)             # committed after all, or its last try ended (failed)
                    break
                left.advance(key, t + 1)
                got = take(g, a, t + 1)
                if isinstance(got, Claim):
                    return got
                if got == "closed":
                    return None
                if got == "committed":
                    left.drop(key)
                # "taken": another worker holds try t + 1; look at that one
        return None

    def _take(self, gen_dir: Path, spec: RolloutSpec, g: int, a: int, t: int, worker_id: str,
              lease_s: float) -> Claim | _Miss:
        """Claim try t of attempt (g, a): the Claim, or why not."""
        path = gen_dir / "claims" / f"{g}-{a}-{t}"
        if os.path.lexists(path):
            return "taken"             # one stat, where a failed exclusive create costs four
        record = ClaimRecord(rollout_id=spec.rollout_id, generation=spec.generation, group=g,
                             attempt=a, try_index=t, worker_id=worker_id, lease_s=lease_s)
        # No fsync: a claim lost in a crash only looks like an expired lease.
        if not create_record(path, record, fsync=False, mtime=self._clock() + lease_s,
                             temp_dir=self._temp_dir()):
            return "taken"
        if (gen_dir / "closed").exists():
            os.unlink(path)            # closed while we claimed: hand nothing out
            return "closed"
        if t > 0 and (gen_dir / "commits" / f"{g}-{a}").exists():
            return "committed"         # an earlier try, presumed dead, committed after all
        return Claim(spec.rollout_id, g, a, spec.generation, t, worker_id, lease_s)

    def _attempt_path(self, c: Claim, sub: str, try_index: int | None = None) -> Path:
        gen_dir = self._gen_dir(c.rollout_id, c.generation)
        if sub == "commits":
            return gen_dir / sub / f"{c.group}-{c.attempt}"
        t = c.try_index if try_index is None else try_index
        return gen_dir / sub / f"{c.group}-{c.attempt}-{t}"

    def heartbeat(self, c: Claim) -> None:
        """Renew the claim's lease. StaleGeneration if superseded, LeaseLost if taken over."""
        self._require_current(c)
        if (self._attempt_path(c, "claims", c.try_index + 1).exists()
                or self._attempt_path(c, "fails").exists()):
            raise LeaseLost(f"{c}: the attempt was taken over by a newer try; drop this work")
        path = self._attempt_path(c, "claims")
        now = self._clock()
        try:
            # An expired lease stays expired: others may already count on it being free.
            if os.stat(path).st_mtime <= now:
                raise LeaseLost(f"{c}: the lease expired before this heartbeat; drop this work")
            os.utime(path, (now + c.lease_s, now + c.lease_s))
        except FileNotFoundError:
            raise LeaseLost(f"{c}: the claim is gone (its rollout was closed); drop this work") from None

    def commit(self, c: Claim, ref: str) -> bool:
        """Record the attempt's result. Idempotent: True if the recorded commit is this claim's.

        Raises StaleGeneration if the claim's generation was superseded (before or
        during the commit); such a commit is never read.
        """
        self._require_current(c)
        record = CommitRecord(rollout_id=c.rollout_id, generation=c.generation, group=c.group,
                              attempt=c.attempt, try_index=c.try_index, worker_id=c.worker_id,
                              ref=ref, committed=self._clock())
        path = self._attempt_path(c, "commits")
        made = create_record(path, record, temp_dir=self._temp_dir())
        if not made:
            found = read_record(path, CommitRecord)
            made = (found.try_index, found.worker_id) == (c.try_index, c.worker_id)
        self._require_current(c)
        return made

    def fail(self, c: Claim, reason: str) -> None:
        """Give the attempt back: another try follows unless this was the last one."""
        create_record(self._attempt_path(c, "fails"), FailRecord(
            rollout_id=c.rollout_id, generation=c.generation, group=c.group, attempt=c.attempt,
            try_index=c.try_index, worker_id=c.worker_id, reason=reason[:2000]), fsync=False,
            temp_dir=self._temp_dir())
