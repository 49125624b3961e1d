"""Worker processes are kill -9'd; the ledger's invariants must hold.

First, aimed kills: a worker is told to stop at one of the states an attempt passes through (claimed,
its shard written, committed) on its n-th claim; it says where it stands and waits there, and is
killed there. Every state is hit the same number of times whatever the machine's load, and each kill
is checked to have landed where it aimed. Then kills at random points, while six workers finish the
rollout. Every random choice (which worker dies when, each worker's claims and pauses) comes from one
seed, printed with the test's output; AGENTRL_FAULT_SEED=N replays it (the random kills still land
where the scheduler puts them).
"""

import json
import multiprocessing
import os
import random
import signal
import time
from collections import Counter

import numpy as np
import pytest

from agentrl.sample import SAMPLE_CODEC, Sample
from hpc.buffer import read_rollout, read_shard, write_shard
from hpc.ledger import Ledger, StaleGeneration

pytestmark = pytest.mark.integration

GROUPS, ATTEMPTS, LEASE_S = 24, 4, 0.5
SEED = int(os.environ.get("AGENTRL_FAULT_SEED") or random.SystemRandom().randrange(2**32))
# Where an aimed kill lands: claimed (before the agent), the shard written (before the commit), committed
# (before the worker's own log line). Each is hit AIMED_PER_STATE times, each on a worker's first to third claim.
STATES, AIMED_PER_STATE = ("claimed", "written", "committed"), 3


def worker(root: str, worker_id: str, seed: str, stop_at: tuple[str, int] | None = None, clock_offset_s: float = 0.0,
           until: float = float("inf")) -> None:
    """Claims, runs, writes and commits until killed (or, at `until` on time.time, stops); its clock
    is `clock_offset_s` off the machine's (a node whose clock is off)."""
    led = Ledger(f"{root}/ledger", seed=hash_seed(f"{seed}/ledger"), clock=lambda: time.time() + clock_offset_s)
    rng = random.Random(f"{seed}/agent")
    log = open(f"{root}/log/{worker_id}.jsonl", "a", buffering=1)
    claims = 0

    def reached(state: str, c) -> None:
        """On the aimed claim, at the aimed state: say so (one atomic file) and wait to be killed."""
        if stop_at == (state, claims):
            with open(f"{root}/at/.{worker_id}", "w") as f:
                json.dump({"state": state, "key": [c.group, c.attempt], "try": c.try_index}, f)
            os.rename(f"{root}/at/.{worker_id}", f"{root}/at/{worker_id}")
            time.sleep(3600)

    while time.time() < until:
        c = led.claim(worker_id, lease_s=LEASE_S)
        if c is None:
            time.sleep(0.01)
            continue
        claims += 1
        reached("claimed", c)
        time.sleep(rng.uniform(0.01, 0.08))  # the "agent"; random kills land before, in and after it
        n = 3 + c.attempt
        sample = Sample(tokens=np.arange(n + 2), response_length=n, loss_mask=np.ones(n),
                        rollout_log_probs=np.full(n, -0.5), reward=float(c.group), status="completed",
                        group_index=c.group, attempt=c.attempt)
        ref = write_shard(f"{root}/buffer", c, [sample], SAMPLE_CODEC)
        reached("written", c)
        try:
            made = led.commit(c, ref)
        except StaleGeneration:
            continue
        reached("committed", c)
        log.write(json.dumps({"key": [c.group, c.attempt], "try": c.try_index, "made": made}) + "\n")


def hash_seed(text: str) -> int:
    return random.Random(text).randrange(2**32)


def test_kill_9_at_random_points_keeps_every_invariant(tmp_path):
    kill_9_run([str(tmp_path)])


def kill_9_run(roots: list[str], *, random_kills: int = 40, deadline_s: float = 120) -> None:
    """The aimed kills, then the random ones. `roots`: one directory as each client of a shared filesystem
    sees it (one mount each); worker n works through roots[n % len(roots)], the checks read roots[0]."""
    print(f"seed {SEED}: replay with AGENTRL_FAULT_SEED={SEED}")
    root = roots[0]
    os.makedirs(f"{root}/log")
    os.makedirs(f"{root}/at")
    led = Ledger(f"{root}/ledger")
    led.open_rollout(0, list(range(GROUPS)), ATTEMPTS, max_tries=1000)
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(f"{SEED}/killer")
    procs, serial, kills = {}, 0, 0
    deadline = time.monotonic() + deadline_s

    def spawn(stop_at=None):
        nonlocal serial
        serial += 1
        p = ctx.Process(target=worker, args=(roots[serial % len(roots)], f"w{serial}", f"{SEED}/w{serial}", stop_at),
                        daemon=True)
        p.start()
        procs[p.pid] = p
        return p, f"w{serial}"

    # The aimed kills, one worker at a time: it claims, commits n - 1 attempts, and stops at the aimed state
    landed = []
    for state in STATES * AIMED_PER_STATE:
        aim = (state, rng.randint(1, 3))
        p, name = spawn(aim)
        while not os.path.exists(f"{roots[serial % len(roots)]}/at/{name}"):     # as its own client sees it
            assert p.is_alive() and time.monotonic() < deadline, f"{name} never reached {aim}"
            time.sleep(0.01)
        os.kill(p.pid, signal.SIGKILL)
        procs.pop(p.pid).join()
        landed.append({**json.load(open(f"{roots[serial % len(roots)]}/at/{name}")), "aim": aim})
    assert [k["state"] for k in landed] == [k["aim"][0] for k in landed] == list(STATES * AIMED_PER_STATE)

    for _ in range(6):
        spawn()
    try:
        while kills < random_kills and led.status(0).committed < GROUPS * ATTEMPTS:
            assert time.monotonic() < deadline, "ledger stalled while workers were being killed"
            time.sleep(rng.uniform(0.0, 0.05))
            victim = rng.choice(list(procs))
            os.kill(victim, signal.SIGKILL)
            procs.pop(victim).join()
            kills += 1
            spawn()
        while (st := led.status(0)).committed < GROUPS * ATTEMPTS:
            assert time.monotonic() < deadline, f"not every attempt was committed: {st}"
            time.sleep(0.05)
    finally:
        for p in procs.values():
            p.kill()
            p.join()

    st = led.status(0)
    assert (st.committed, st.failed, st.complete_groups) == (GROUPS * ATTEMPTS, 0, list(range(GROUPS)))
    commits = led.commits(0)
    # A worker killed holding a claim (before its commit) lost the attempt to a later try, whose commit
    # stands; one killed just after its commit kept it: the attempt was not done again.
    for k in landed:
        rec = commits[tuple(k["key"])]
        if k["state"] == "committed":
            assert rec.try_index == k["try"], k
        else:
            assert rec.try_index > k["try"], k
    print(f"{len(landed)} aimed kills, then {kills} at random points")
    # At most one winning commit per attempt, as the workers saw it.
    made = Counter()
    for name in os.listdir(f"{root}/log"):
        for line in open(f"{root}/log/{name}"):
            rec = json.loads(line)
            made[tuple(rec["key"])] += rec["made"]
    assert max(made.values()) == 1
    # Every commit points at a whole shard of exactly that attempt and try.
    assert sorted(commits) == [(g, a) for g in range(GROUPS) for a in range(ATTEMPTS)]
    for (g, a), rec in commits.items():
        header, samples = read_shard(f"{root}/buffer/{rec.ref}", SAMPLE_CODEC)
        assert (header["group"], header["attempt"], header["try_index"]) == (g, a, rec.try_index)
    by_group = read_rollout(led, f"{root}/buffer", 0, SAMPLE_CODEC)
    assert {g: sorted(s.attempt for s in ss) for g, ss in by_group.items()} == \
        {g: list(range(ATTEMPTS)) for g in range(GROUPS)}
    assert all(s.reward == g for g, ss in by_group.items() for s in ss)
