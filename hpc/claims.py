"""The worker side of the ledger as one asyncio loop: claim, run, renew the lease, cancel on losing it.

The rollout pool and checkpoint eval both run their attempts through `ClaimLoop`: first it checks this
node's clock against the filesystem's (hpc.clockcheck: refused past half a lease); then at most `slots`
claims at once, each renewed every lease_s / 3 while its work runs. A lease that is lost (the
attempt's next try was handed to another worker, or the generation was superseded) cancels the work
at once: its result could no longer count, and the sandbox it holds is another worker's now. Work
that raises fails its claim, so the ledger hands the attempt out again within max_tries.

`on_claim(claim, start, end)`, if given, hears how long each claim that got one took (time.monotonic,
in the thread that claimed: the claim itself, not the hand-off to the thread).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from .clockcheck import check_clock
from .ledger import Claim, Ledger, StaleGeneration
from .ledger_records import RolloutSpec

log = logging.getLogger("hpc.claims")

Work = Callable[[Claim], Coroutine[Any, Any, None]]     # a coroutine: asyncio.create_task runs it


@dataclass
class ClaimLoop:
    ledger: Ledger
    worker_id: str
    lease_s: float
    poll_s: float
    slots: int                                   # claims running at once
    rollout_id: int | None = None                # only this rollout's attempts (eval); None: any open one
    check: Callable[[RolloutSpec], None] | None = None   # Ledger.claim's: raise to refuse a rollout
    counts: Counter = field(default_factory=Counter)     # "lease_lost", "work_errors"
    on_claim: Callable[[Claim, float, float], None] | None = None   # (claim, start, end): timing, for benchmarks

    async def run(self, work: Work, *, stop: asyncio.Event | None = None, max_claims: int | None = None,
                  until_done: bool = False) -> None:
        """Claim and run `work` until `stop` is set, `max_claims` were started, or (until_done, with
        rollout_id) every attempt of the rollout has ended."""
        if until_done and self.rollout_id is None:
            raise ValueError("until_done needs rollout_id: which rollout must be done")
        # Leases are this node's clock against the others': too far from the filesystem's, refuse to start
        await asyncio.to_thread(check_clock, self.ledger.root, self.lease_s, self.ledger.clock)
        stop = stop or asyncio.Event()
        slots = asyncio.Semaphore(self.slots)
        running: set[asyncio.Task[None]] = set()
        started = 0

        def finished(task: asyncio.Task[None]) -> None:
            running.discard(task)
            slots.release()

        try:
            while not stop.is_set() and (max_claims is None or started < max_claims):
                if until_done and not running and await asyncio.to_thread(self._ended):
                    break
                await slots.acquire()
                claim = await asyncio.to_thread(self._claim)
                if claim is None:
                    slots.release()
                    try:
                        await asyncio.wait_for(stop.wait(), self.poll_s)
                    except asyncio.TimeoutError:
                        pass
                    continue
                started += 1
                task = asyncio.create_task(self._one(work, claim))
                running.add(task)
                task.add_done_callback(finished)
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        finally:
            for t in running:
                t.cancel()

    def _claim(self) -> Claim | None:
        start = time.monotonic()
        claim = self.ledger.claim(self.worker_id, self.lease_s, self.rollout_id, self.check)
        if claim is not None and self.on_claim is not None:
            self.on_claim(claim, start, time.monotonic())
        return claim

    def _ended(self) -> bool:
        assert self.rollout_id is not None, "until_done needs rollout_id"    # checked by run()
        st = self.ledger.status(self.rollout_id)
        return st.committed + st.failed >= st.total

    async def _one(self, work: Work, claim: Claim) -> None:
        job = asyncio.create_task(work(claim))
        lost = asyncio.Event()
        beat = asyncio.create_task(self._renew(claim, job, lost))
        try:
            await job
        except asyncio.CancelledError:
            if not lost.is_set():
                raise                    # the loop itself is being cancelled
            self.counts["lease_lost"] += 1
            log.warning("%s: lease lost, the attempt is dropped (another worker has it)", _name(claim))
        except Exception as e:   # noqa: BLE001 - one claim's work must not stop the loop
            self.counts["work_errors"] += 1
            log.exception("%s: the work raised; failing the claim", _name(claim))
            await asyncio.to_thread(self.ledger.fail, claim, f"error: {e!r}"[:2000])
        finally:
            beat.cancel()

    async def _renew(self, claim: Claim, job: asyncio.Task[None], lost: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await asyncio.to_thread(self.ledger.heartbeat, claim)
            except StaleGeneration:      # LeaseLost included: someone else owns the attempt now
                lost.set()
                job.cancel()
                return
            except OSError as e:         # a filesystem hiccup: the next renewal may get through
                log.warning("%s: lease renewal failed (%s); retrying in %.0f s", _name(claim), e, self.lease_s / 3)


def _name(c: Claim) -> str:
    return f"rollout {c.rollout_id} group {c.group} attempt {c.attempt} try {c.try_index}"
