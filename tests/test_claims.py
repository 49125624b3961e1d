"""Issue 15, defect 8: one claim/lease/heartbeat loop for the pool and eval; a lost lease cancels the work."""

import asyncio
import time

import pytest

from agentrl.eval.config import load_eval_config
from agentrl.eval.score import CheckpointEval
from hpc.claims import ClaimLoop
from hpc.ledger import Claim, Ledger
from hpc.ledger_records import ClaimRecord
from hpc.records import create_record


def steal(ledger: Ledger, claim: Claim) -> None:
    """Another worker holds the attempt's next try, as after this worker's lease ran out (made directly, so
    that the loop under test cannot race the thief for it)."""
    claims = ledger.root / f"rollouts/{claim.rollout_id}/g{claim.generation}/claims"
    assert create_record(claims / f"{claim.group}-{claim.attempt}-1", ClaimRecord(
        rollout_id=claim.rollout_id, generation=claim.generation, group=claim.group, attempt=claim.attempt,
        try_index=1, worker_id="thief", lease_s=60), mtime=time.time() + 60)


def test_a_lost_lease_cancels_the_work_and_the_loop_goes_on(tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    ledger.open_rollout(0, [0, 1], 1)
    seen: dict[int, str] = {}

    async def work(claim: Claim) -> None:
        if claim.group == 0:
            steal(ledger, claim)
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen[0] = "cancelled"
                raise
        else:
            assert ledger.commit(claim, "ref")
            seen[1] = "committed"

    loop = ClaimLoop(ledger, "w", lease_s=0.6, poll_s=0.05, slots=2, rollout_id=0)
    stop = asyncio.Event()

    async def main():
        asyncio.get_running_loop().call_later(5, stop.set)    # a hang guard, not the test's pass condition
        await loop.run(work, stop=stop, max_claims=2)
    asyncio.run(main())
    assert seen == {0: "cancelled", 1: "committed"} and loop.counts["lease_lost"] == 1


def test_work_that_raises_fails_its_claim_and_until_done_ends_when_every_attempt_has(tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    ledger.open_rollout(0, [0], 2, max_tries=2)

    async def work(claim: Claim) -> None:
        if claim.attempt == 0:
            raise RuntimeError("boom")
        ledger.commit(claim, "ref")

    loop = ClaimLoop(ledger, "w", lease_s=30, poll_s=0.05, slots=1, rollout_id=0)
    asyncio.run(asyncio.wait_for(loop.run(work, until_done=True), 20))
    st = ledger.status(0)
    assert (st.committed, st.failed) == (1, 1) and loop.counts["work_errors"] == 2   # both tries of attempt 0
    with pytest.raises(ValueError, match="until_done needs rollout_id"):
        asyncio.run(ClaimLoop(ledger, "w", 30, 0.05, 1).run(work, until_done=True))


@pytest.mark.integration
def test_an_eval_attempt_whose_lease_is_lost_is_cancelled(tmp_path, monkeypatch):
    """The eval used to keep running an attempt another evaluator had taken over."""
    from types import SimpleNamespace

    import agentrl.pool.claimed as claimed

    cancelled = []

    async def run_attempt(ctx, task, *, group, attempt, sampling, on_span):
        steal(ledger, Claim(0, group, attempt, ledger.current_generation(0)))
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append((group, attempt))
            raise

    monkeypatch.setattr(claimed, "run_attempt", run_attempt)

    async def up(**kwargs):
        return "http://model-server"
    ctx = SimpleNamespace(adapter=SimpleNamespace(pool=SimpleNamespace(wait_healthy=up)))
    cfg = load_eval_config({"tasks": "unused.jsonl", "n_samples": 1, "pool": {"lease_s": 6, "poll_s": 0.1}})
    task = SimpleNamespace(spec=SimpleNamespace(instance_id="t"))
    ev = CheckpointEval(tmp_path / "out", cfg, [task], iteration=1)
    ledger = ev.ledger()
    with pytest.raises(asyncio.TimeoutError):        # the thief never commits: the eval waits on, as it should
        asyncio.run(asyncio.wait_for(ev._attempts(ledger, ctx), 8))
    assert cancelled == [(0, 0)]                     # cancelled at the first renewal (lease_s / 3), not at 60 s
