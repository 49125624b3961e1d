"""Worker processes are kill -9'd at random points; the ledger's invariants must hold.

Every random choice (which worker dies when, each worker's claims and pauses) comes from one seed,
printed with the test's output; AGENTRL_FAULT_SEED=N replays it (the kills still land where the
scheduler puts them).
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

GROUPS, ATTEMPTS, LEASE_S = 24, 4, 0.5  # enough work that it outlasts at least 10 kills, whatever the seed
SEED = int(os.environ.get("AGENTRL_FAULT_SEED") or random.SystemRandom().randrange(2**32))


def worker(root: str, worker_id: str, seed: str) -> None:
    led = Ledger(f"{root}/ledger", seed=hash_seed(f"{seed}/ledger"))
    rng = random.Random(f"{seed}/agent")
    log = open(f"{root}/log/{worker_id}.jsonl", "a", buffering=1)
    while True:
        c = led.claim(worker_id, lease_s=LEASE_S)
        if c is None:
            time.sleep(0.01)
            continue
        time.sleep(rng.uniform(0.01, 0.08))  # the "agent"; kills land before, in and after it
        n = 3 + c.attempt
        sample = Sample(tokens=np.arange(n + 2), response_length=n, loss_mask=np.ones(n),
                        rollout_log_probs=np.full(n, -0.5), reward=float(c.group), status="completed",
                        group_index=c.group, attempt=c.attempt)
        ref = write_shard(f"{root}/buffer", c, [sample], SAMPLE_CODEC)
        try:
            made = led.commit(c, ref)
        except StaleGeneration:
            continue
        log.write(json.dumps({"key": [c.group, c.attempt], "try": c.try_index, "made": made}) + "\n")


def hash_seed(text: str) -> int:
    return random.Random(text).randrange(2**32)


def test_kill_9_at_random_points_keeps_every_invariant(tmp_path):
    print(f"seed {SEED}: replay with AGENTRL_FAULT_SEED={SEED}")
    root = str(tmp_path)
    os.makedirs(f"{root}/log")
    led = Ledger(f"{root}/ledger")
    led.open_rollout(0, list(range(GROUPS)), ATTEMPTS, max_tries=1000)
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(f"{SEED}/killer")
    procs, serial, kills = {}, 0, 0

    def spawn():
        nonlocal serial
        serial += 1
        p = ctx.Process(target=worker, args=(root, f"w{serial}", f"{SEED}/w{serial}"), daemon=True)
        p.start()
        procs[p.pid] = p

    for _ in range(6):
        spawn()
    deadline = time.monotonic() + 90
    try:
        while kills < 40 and led.status(0).committed < GROUPS * ATTEMPTS:
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
    assert kills >= 10
    assert any(rec.try_index > 0 for rec in led.commits(0).values()), "no lease was ever reclaimed"
    # At most one winning commit per attempt, as the workers saw it.
    made = Counter()
    for name in os.listdir(f"{root}/log"):
        for line in open(f"{root}/log/{name}"):
            rec = json.loads(line)
            made[tuple(rec["key"])] += rec["made"]
    assert max(made.values()) == 1
    # Every commit points at a whole shard of exactly that attempt and try.
    commits = led.commits(0)
    assert sorted(commits) == [(g, a) for g in range(GROUPS) for a in range(ATTEMPTS)]
    for (g, a), rec in commits.items():
        header, samples = read_shard(f"{root}/buffer/{rec.ref}", SAMPLE_CODEC)
        assert (header["group"], header["attempt"], header["try_index"]) == (g, a, rec.try_index)
    by_group = read_rollout(led, f"{root}/buffer", 0, SAMPLE_CODEC)
    assert {g: sorted(s.attempt for s in ss) for g, ss in by_group.items()} == \
        {g: list(range(ATTEMPTS)) for g in range(GROUPS)}
    assert all(s.reward == g for g, ss in by_group.items() for s in ss)
