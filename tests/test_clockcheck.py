"""A role whose clock is off from the shared filesystem's says so at start, and past half a lease refuses."""

import asyncio
import logging
import time

import pytest

from hpc.claims import ClaimLoop
from hpc.clockcheck import ClockSkewError, check_clock, filesystem_skew, verdict
from hpc.ledger import Ledger


def test_the_verdict_by_the_share_of_the_lease():
    assert verdict(0.5, 60) == ("ok", None)
    level, said = verdict(-12, 60)
    assert level == "warn" and "12.0 s ahead of the shared filesystem's, against a lease of 60 s" in said
    assert "NTP" in said and "chronyc tracking" in said
    level, said = verdict(40, 60)
    assert level == "refuse" and "40.0 s behind" in said and "pool.lease_s" in said


def test_this_nodes_clock_against_the_filesystems(tmp_path, caplog):
    assert abs(filesystem_skew(tmp_path)) < 0.5 and list(tmp_path.iterdir()) == []     # the probe is gone
    assert abs(filesystem_skew(tmp_path, clock=lambda: time.time() + 40) + 40) < 0.5
    with caplog.at_level(logging.WARNING, logger="hpc.clock"):
        check_clock(tmp_path, 60)
        assert not caplog.records
        check_clock(tmp_path, 60, clock=lambda: time.time() - 10)
    assert "10.0 s behind the shared filesystem's" in caplog.text
    with pytest.raises(ClockSkewError, match=r"40\.\d s ahead of .* more than 0.5 of a lease"):
        check_clock(tmp_path, 60, clock=lambda: time.time() + 40)


def test_a_claim_loop_on_a_node_whose_clock_runs_two_leases_fast_refuses_to_start(tmp_path):
    led = Ledger(tmp_path / "ledger", clock=lambda: time.time() + 120)
    led.open_rollout(0, [0], 1)
    ran = []

    async def work(claim):
        ran.append(claim)
    with pytest.raises(ClockSkewError, match="ahead of the shared filesystem's, against a lease of 60 s"):
        asyncio.run(ClaimLoop(led, "w", 60, 0.01, 1).run(work, max_claims=1))
    assert ran == [] and led.status(0).claimed == 0
