"""Rollout ledger throughput and claim latency, beside the filesystem's fsync floor; and what a claim costs
as the outstanding attempts grow.

For 1, 8 and 32 worker processes: claim+commit pairs per second and p50/p99
claim latency, and the same number of processes running the floor loop
(temp write + fsync + rename) on the same filesystem. A commit is one fsynced
exclusive create, so the ratio says how much of the floor the ledger keeps.

At scale: a rollout with N attempts outstanding (100 to 100,000), half of them held by
other workers' live claims; 16 workers claim and commit 4 attempts each, and the pairs'
file-system calls are counted (benchmarks/fs_calls.py: the round trips a shared
filesystem's server would see) and timed. The target (issue 17) is a constant count, at
most 40 calls per pair; today a worker's listing stats every live claim, so the count
grows with N.

    python -m benchmarks.ledger_bench [--dir DIR] [--procs 1,8,32] [--pairs N]
                                      [--outstanding 100,10000,100000] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import percentile
from benchmarks.fs_calls import counted
from hpc.ledger import Ledger

TARGET_PAIRS_PER_S = 1000   # at 32 processes, local disk
TARGET_P99_MS = 20.0
TARGET_CALLS_PER_PAIR = 40  # whatever the number of outstanding attempts
SCALE_ATTEMPTS = 8          # attempts per group in the scale rollouts
SCALE_WORKERS = 16          # claiming workers in the scale rows
SCALE_CLAIMS = 4            # claim+commit pairs each makes


def _floor_worker(d: str, i: int, n: int, barrier, out) -> None:
    lat = []
    barrier.wait()
    t0 = time.perf_counter()
    for k in range(n):
        c0 = time.perf_counter()
        tmp, dst = f"{d}/.t{i}-{k}", f"{d}/f{i}-{k}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"x" * 300)  # about the size of a commit record
        os.fsync(fd)
        os.close(fd)
        os.rename(tmp, dst)
        lat.append(time.perf_counter() - c0)
    out.put((t0, time.perf_counter(), lat))


def _ledger_worker(d: str, i: int, n: int, barrier, out) -> None:
    led = Ledger(d, seed=i)
    lat = []
    barrier.wait()
    t0 = time.perf_counter()
    while True:
        c0 = time.perf_counter()
        c = led.claim(f"w{i}", lease_s=600)
        lat.append(time.perf_counter() - c0)
        if c is None:
            break
        led.commit(c, f"shard-{c.group}-{c.attempt}")
    out.put((t0, time.perf_counter(), lat))


def _run(target, d: str, procs: int, per_proc: int) -> tuple[float, list[float]]:
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=target, args=(d, i, per_proc, barrier, out)) for i in range(procs)]
    for p in ps:
        p.start()
    results = [out.get() for _ in ps]
    for p in ps:
        p.join()
    wall = max(r[1] for r in results) - min(r[0] for r in results)
    return wall, [x for r in results for x in r[2]]


def _ms(xs: list[float], q: float) -> float:
    return percentile(xs, q) * 1000


def measure(base: Path, procs: int, pairs: int) -> dict:
    per_proc = max(1, pairs // procs)
    total = per_proc * procs
    floor_dir = Path(tempfile.mkdtemp(prefix="floor-", dir=base))
    floor_wall, floor_lat = _run(_floor_worker, str(floor_dir), procs, per_proc)
    led_dir = Path(tempfile.mkdtemp(prefix="ledger-", dir=base))
    attempts = 8
    Ledger(led_dir).open_rollout(0, list(range((total + attempts - 1) // attempts)), attempts)
    total = ((total + attempts - 1) // attempts) * attempts
    wall, lat = _run(_ledger_worker, str(led_dir), procs, per_proc)
    pairs_s, floor_s = total / wall, per_proc * procs / floor_wall
    return {"procs": procs, "pairs": total, "pairs_per_s": round(pairs_s, 1),
            "claim_p50_ms": round(_ms(lat, 0.50), 3), "claim_p99_ms": round(_ms(lat, 0.99), 3),
            "floor_ops_per_s": round(floor_s, 1), "ratio_to_floor": round(pairs_s / floor_s, 3),
            "floor_op_p50_ms": round(_ms(floor_lat, 0.50), 3), "floor_op_p99_ms": round(_ms(floor_lat, 0.99), 3)}


def at_scale(base: Path, outstanding: int, workers: int = SCALE_WORKERS, claims_each: int = SCALE_CLAIMS) -> dict:
    """`workers` workers (Ledger objects of one process) against `outstanding` attempts, half of them held by
    others' live claims: each in turn claims and commits, `claims_each` times. What a pair costs is what
    its share of a worker's listings and skips costs: a busy pool's workers claim a few attempts each
    between their listings of a rollout."""
    led_dir = Path(tempfile.mkdtemp(prefix=f"scale-{outstanding}-", dir=base))
    groups = max(1, -(-outstanding // SCALE_ATTEMPTS))
    Ledger(led_dir).open_rollout(0, list(range(groups)), SCALE_ATTEMPTS)
    others = Ledger(led_dir, seed=1)
    for _ in range(groups * SCALE_ATTEMPTS // 2):
        others.claim("others", lease_s=3600)
    pool = [Ledger(led_dir, seed=10 + i) for i in range(workers)]
    lat: list[float] = []
    with counted() as calls:
        for _ in range(claims_each):
            for i, worker in enumerate(pool):
                t0 = time.perf_counter()
                c = worker.claim(f"w{i}", lease_s=3600)
                if c is None:
                    continue
                worker.commit(c, f"shard-{c.group}-{c.attempt}")
                lat.append(time.perf_counter() - t0)
    return {"outstanding": groups * SCALE_ATTEMPTS, "workers": workers, "pairs": len(lat),
            "calls_per_pair": round(sum(calls.values()) / max(1, len(lat)), 1),
            "stats_per_pair": round((calls["stat"] + calls["lstat"]) / max(1, len(lat)), 1),
            "pair_p50_ms": round(_ms(lat, 0.50), 3), "pair_p99_ms": round(_ms(lat, 0.99), 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="filesystem to measure (default: a temp dir under /tmp)")
    ap.add_argument("--procs", default="1,8,32", help="comma-separated process counts")
    ap.add_argument("--pairs", type=int, default=4096, help="claim+commit pairs per measurement")
    ap.add_argument("--outstanding", default="100,10000,100000",
                    help="comma-separated outstanding attempt counts for the scale rows ('' for none)")
    ap.add_argument("--json", action="store_true", help="end with one JSON object of the figures")
    args = ap.parse_args(argv)
    try:
        procs = [int(p) for p in args.procs.split(",")]
        assert procs and all(p > 0 for p in procs)
    except (ValueError, AssertionError):
        ap.error(f"--procs must be positive integers separated by commas, got {args.procs!r}")
    try:
        outstanding = [int(n) for n in args.outstanding.split(",") if n.strip()]
        assert all(n >= 2 for n in outstanding)
    except (ValueError, AssertionError):
        ap.error(f"--outstanding must be integers of at least 2 separated by commas, got {args.outstanding!r}")
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    if args.dir and not Path(args.dir).is_dir():
        ap.error(f"--dir {args.dir} is not a directory")

    with tempfile.TemporaryDirectory(prefix="ledger-bench-", dir=args.dir) as base:
        rows = []
        print(f"{'procs':>5} {'ledger pairs/s':>15} {'floor ops/s':>12} {'ratio':>6} "
              f"{'claim p50 ms':>13} {'claim p99 ms':>13} {'floor p99 ms':>13}")
        for n in procs:
            r = measure(Path(base), n, args.pairs)
            rows.append(r)
            print(f"{r['procs']:>5} {r['pairs_per_s']:>15.0f} {r['floor_ops_per_s']:>12.0f} "
                  f"{r['ratio_to_floor']:>6.2f} {r['claim_p50_ms']:>13.2f} {r['claim_p99_ms']:>13.2f} "
                  f"{r['floor_op_p99_ms']:>13.2f}",
                  flush=True)
        print("floor: one process loop of temp write + fsync + rename per op, same process count, same filesystem")
        print(f"targets: >= {TARGET_PAIRS_PER_S} pairs/s at 32 processes, p99 claim <= {TARGET_P99_MS} ms")
        scale = []
        if outstanding:
            print(f"\n{SCALE_WORKERS} workers claiming {SCALE_CLAIMS} attempts each, others holding half the attempts")
            print(f"{'outstanding':>11} {'calls/pair':>11} {'stats/pair':>11} {'pair p50 ms':>12} {'pair p99 ms':>12}")
        for n in outstanding:
            r = at_scale(Path(base), n)
            scale.append(r)
            print(f"{r['outstanding']:>11} {r['calls_per_pair']:>11.1f} {r['stats_per_pair']:>11.1f} "
                  f"{r['pair_p50_ms']:>12.2f} {r['pair_p99_ms']:>12.2f}", flush=True)
        if outstanding:
            print(f"target: a constant count of at most {TARGET_CALLS_PER_PAIR} file-system calls per claim+commit")
    if args.json:
        print(json.dumps({"benchmark": "ledger", "filesystem": args.dir or tempfile.gettempdir(),
                          "cpus": os.cpu_count(), "results": rows, "scale": scale}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
