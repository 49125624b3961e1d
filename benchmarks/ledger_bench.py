"""Rollout ledger throughput and claim latency, beside the filesystem's fsync floor; and what a claim costs
as the outstanding attempts grow, beside the design before issue 17.

For 1, 8 and 32 worker processes: claim+commit pairs per second and p50/p99
claim latency, and the same number of processes running the floor loop
(temp write + fsync + rename) on the same filesystem. A commit is one fsynced
exclusive create, so the ratio says how much of the floor the ledger keeps.

At scale: a rollout with N attempts outstanding (100 to 100,000), half of them held by
other workers' live claims, and the file-system calls of each claim+commit counted
(benchmarks/fs_calls.py: the round trips a shared filesystem's server would see) and
timed. Before: the claim of commit bef6541 (its listing logic, copied below as
`Before`), whose every listing read the lease of every live claim, with 16 workers
claiming 4 attempts each; after: today's claim, with the same 16 workers, and with
1,000 simulated workers (Ledger objects of one process) claiming 2 each, or until the
rollout has no unclaimed attempt left. The target (issue 17) is a constant count, at
most 40 calls per pair, whatever N.

A shared filesystem beside local disk, in one run: --dir on the shared one (a GlusterFS client,
`make gluster-up`) and --beside on local disk. The throughput rows run on both, and a last table
gives today's pairs/s and claim latency on each, --dir's pairs/s over --beside's as the ratio
(issue 28's target: at least 0.25 at 8 processes). The scale rows run on --dir only.

    python -m benchmarks.ledger_bench [--dir DIR] [--beside DIR] [--procs 1,8,32] [--pairs N]
                                      [--outstanding 100,1000,10000,100000] [--workers 1000] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import multiprocessing as mp
import os
import random
import tempfile
import time
from collections import Counter

from benchmarks.common import percentile
from benchmarks.fs_calls import counted
from hpc.ledger import Claim, Ledger
from hpc.ledger_records import ClaimRecord, RolloutSpec
from hpc.ledger_state import TryKey, claimable
from hpc.records import create_record

TARGET_PAIRS_PER_S = 1000   # at 32 processes, local disk
TARGET_P99_MS = 20.0
TARGET_CALLS_PER_PAIR = 40  # whatever the number of outstanding attempts
SCALE_ATTEMPTS = 8          # attempts per group in the scale rollouts
FEW_WORKERS, FEW_CLAIMS = 16, 4     # the baseline's workers (bef6541), each claiming 4 attempts
MANY_CLAIMS = 2                     # claims of each of --workers simulated workers
LINKS_PER_FILE = 32                 # a GlusterFS brick on ext4 refuses a file's 47th link (ENOSPC: xattrs)
TARGET_SHARED_RATIO, SHARED_RATIO_PROCS = 0.25, 8   # --dir's pairs/s over --beside's, at 8 processes


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


def _ledger_worker(d: str, i: int, n: int, barrier, out, design: type[Ledger]) -> None:
    led = design(d, seed=i)
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


def _run(target, d: str, procs: int, per_proc: int, *extra) -> tuple[float, list[float]]:
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=target, args=(d, i, per_proc, barrier, out, *extra)) for i in range(procs)]
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
    """The floor, then the claim before issue 17 (`Before`), then today's, each with `procs` processes on
    a rollout of `pairs` attempts."""
    per_proc = max(1, pairs // procs)
    floor_dir = Path(tempfile.mkdtemp(prefix="floor-", dir=base))
    floor_wall, floor_lat = _run(_floor_worker, str(floor_dir), procs, per_proc)
    floor_s = per_proc * procs / floor_wall
    row: dict = {"procs": procs, "floor_ops_per_s": round(floor_s, 1),
                 "floor_op_p50_ms": round(_ms(floor_lat, 0.50), 3), "floor_op_p99_ms": round(_ms(floor_lat, 0.99), 3)}
    attempts = 8
    groups = -(-per_proc * procs // attempts)
    for name, design in (("before", Before), ("after", Ledger)):
        led_dir = Path(tempfile.mkdtemp(prefix=f"ledger-{name}-", dir=base))
        Ledger(led_dir).open_rollout(0, list(range(groups)), attempts)
        wall, lat = _run(_ledger_worker, str(led_dir), procs, per_proc, design)
        pairs_s = groups * attempts / wall
        row[name] = {"pairs": groups * attempts, "pairs_per_s": round(pairs_s, 1),
                     "ratio_to_floor": round(pairs_s / floor_s, 3),
                     "claim_p50_ms": round(_ms(lat, 0.50), 3), "claim_p99_ms": round(_ms(lat, 0.99), 3)}
    return row


class Before(Ledger):
    """The claim of commit bef6541, to be measured beside today's: each worker walks its own shuffled list of
    claimable attempts, and lists again when it runs dry; a listing reads the lease of every live claim
    (LedgerView._observe, as status() still does), so its cost grows with the attempts out. Its listing
    logic only: the rest is today's, two calls a claim cheaper than bef6541 (no stat of the generation's
    directory, none of a first try's commit)."""

    def __init__(self, root: Path | str, **kwargs) -> None:
        super().__init__(root, **kwargs)
        self._candidates: dict[Path, list[TryKey]] = {}

    def _claim_in(self, gen_dir: Path, spec: RolloutSpec, worker_id: str, lease_s: float) -> Claim | None:
        for cands in (self._candidates.pop(gen_dir, []), None):
            if cands is None:
                cands = claimable(self._state_spec(spec), self._observe(gen_dir), self._clock())
                self._rng.shuffle(cands)
            while cands:
                got = self._take(gen_dir, spec, *cands.pop(), worker_id, lease_s)
                if got == "closed":
                    return None
                if isinstance(got, Claim):
                    self._candidates[gen_dir] = cands
                    return got
        return None


def scale_ledger(base: Path, outstanding: int, seed: int = 0, held: float = 0.5) -> Path:
    """A ledger whose one rollout has `outstanding` attempts (whole groups of 8), a `held` share of them,
    drawn at random, held by others' live claims: hard links of claim files, whose mtime is an hour's
    lease. A claim's lease is its mtime and nobody reads its content; 50,000 files take the development
    VM's disk a minute to create and delete, as many links a second. A file takes LINKS_PER_FILE links
    besides its own name (the ledger itself links each file once)."""
    root = Path(tempfile.mkdtemp(prefix=f"scale-{outstanding}-", dir=base))
    groups = -(-outstanding // SCALE_ATTEMPTS)
    gen = Ledger(root).open_rollout(0, list(range(groups)), SCALE_ATTEMPTS)
    claims = root / "rollouts/0" / f"g{gen}" / "claims"
    total = groups * SCALE_ATTEMPTS
    for k, i in enumerate(random.Random(seed).sample(range(total), int(total * held))):
        template = root / f"others-claim-{k // LINKS_PER_FILE}"
        if k % LINKS_PER_FILE == 0:
            create_record(template, ClaimRecord(rollout_id=0, generation=gen, group=0, attempt=0, try_index=0,
                                                worker_id="others", lease_s=3600), mtime=time.time() + 3600)
        g, a = divmod(i, SCALE_ATTEMPTS)
        os.link(template, claims / f"{g}-{a}-0")
    return root


def at_scale(root: Path, workers: int, claims_each: int, design: type[Ledger] = Ledger, seed: int = 10) -> dict:
    """`workers` workers (Ledger objects of one process) take turns, in a random order each round, to claim and
    commit, `claims_each` rounds or until the rollout has nothing left to claim. Each pair's file-system calls
    are counted; a claim that finds nothing (the end) is not a pair. What a pair costs is its share of its
    worker's listings and skips: a busy pool's workers claim a few attempts each between listings."""
    pool = [design(root, seed=seed + i) for i in range(workers)]
    rng = random.Random(seed)
    turns = [i for _ in range(claims_each) for i in rng.sample(range(workers), workers)]
    per_pair: list[int] = []
    stats = 0
    lat: list[float] = []
    with counted() as calls:
        for i in turns:
            before = calls.copy()
            t0 = time.perf_counter()
            c = pool[i].claim(f"w{i}", lease_s=3600)
            if c is None:
                break
            pool[i].commit(c, f"shard-{c.group}-{c.attempt}")
            lat.append(time.perf_counter() - t0)
            spent: Counter = calls - before
            per_pair.append(sum(spent.values()))
            stats += spent["stat"] + spent["lstat"]
    n = max(1, len(per_pair))
    return {"workers": workers, "claims_each": claims_each, "pairs": len(per_pair),
            "calls_per_pair": round(sum(per_pair) / n, 1), "stats_per_pair": round(stats / n, 1),
            "max_calls": max(per_pair, default=0),
            "pair_p50_ms": round(_ms(lat, 0.50), 3), "pair_p99_ms": round(_ms(lat, 0.99), 3)}


def scale_row(base: Path, outstanding: int, workers: int) -> dict:
    """Before and after with the baseline's 16 workers, and after with `workers`. They share a rollout while
    those before took under 5% of its unclaimed attempts (so each finds it as the others did); else each
    gets a rollout of its own."""
    free = -(-outstanding // SCALE_ATTEMPTS) * SCALE_ATTEMPTS
    row: dict = {"outstanding": free}
    free, root, taken = free - free // 2, None, 0
    for name, design, n, k in (("before", Before, FEW_WORKERS, FEW_CLAIMS), ("after", Ledger, FEW_WORKERS, FEW_CLAIMS),
                               ("after_many", Ledger, workers, MANY_CLAIMS)):
        if root is None or taken > free // 20:
            root, taken = scale_ledger(base, outstanding), 0
        row[name] = at_scale(root, n, k, design)
        taken += row[name]["pairs"]
    row["ratio"] = round(row["before"]["calls_per_pair"] / max(0.1, row["after"]["calls_per_pair"]), 1)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="filesystem to measure (default: a temp dir under /tmp)")
    ap.add_argument("--beside", default=None,
                    help="a second filesystem (local disk) whose throughput rows are measured beside --dir's")
    ap.add_argument("--procs", default="1,8,32", help="comma-separated process counts")
    ap.add_argument("--pairs", type=int, default=4096, help="claim+commit pairs per measurement")
    ap.add_argument("--outstanding", default="100,1000,10000,100000",
                    help="comma-separated outstanding attempt counts for the scale rows ('' for none)")
    ap.add_argument("--workers", type=int, default=1000, help="simulated workers of the scale rows' last columns")
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
    if args.workers < 1:
        ap.error("--workers must be at least 1")
    for flag, d in (("--dir", args.dir), ("--beside", args.beside)):
        if d and not Path(d).is_dir():
            ap.error(f"{flag} {d} is not a directory")

    rows = throughput_rows(args.dir, procs, args.pairs)
    beside = throughput_rows(args.beside, procs, args.pairs) if args.beside else []
    if beside:
        print_shared_vs_local(args.dir or tempfile.gettempdir(), rows, args.beside, beside)
    with tempfile.TemporaryDirectory(prefix="ledger-bench-", dir=args.dir) as base:
        scale = []
        if outstanding:
            print(f"\nfile-system calls per claim+commit (counted, not timed) while others hold half the attempts;\n"
                  f"before (bef6541) and after: {FEW_WORKERS} workers claiming {FEW_CLAIMS} each; "
                  f"many: {args.workers} workers claiming {MANY_CLAIMS} each")
            print(f"{'outstanding':>11} {'before':>7} {'p99 ms':>7} {'after':>6} {'p99 ms':>7} {'ratio':>6} "
                  f"{'many':>6} {'worst':>6} {'stats':>6} {'p50 ms':>7} {'p99 ms':>7}")
        for n in outstanding:
            r = scale_row(Path(base), n, args.workers)
            scale.append(r)
            b, a, m = r["before"], r["after"], r["after_many"]
            print(f"{r['outstanding']:>11} {b['calls_per_pair']:>7.1f} {b['pair_p99_ms']:>7.2f} "
                  f"{a['calls_per_pair']:>6.1f} {a['pair_p99_ms']:>7.2f} {r['ratio']:>5.1f}x "
                  f"{m['calls_per_pair']:>6.1f} {m['max_calls']:>6} {m['stats_per_pair']:>6.1f} "
                  f"{m['pair_p50_ms']:>7.2f} {m['pair_p99_ms']:>7.2f}", flush=True)
        if outstanding:
            many = [r["after_many"]["calls_per_pair"] for r in scale]
            print(f"many: {min(many):.1f} to {max(many):.1f} calls per pair (worst: the most one pair made); "
                  f"target: at most {TARGET_CALLS_PER_PAIR}, the same at every size")
    if args.json:
        print(json.dumps({"benchmark": "ledger", "filesystem": args.dir or tempfile.gettempdir(),
                          "cpus": os.cpu_count(), "results": rows, "scale": scale,
                          **({"beside": {"filesystem": args.beside, "results": beside}} if beside else {})}))
    return 0


def throughput_rows(where: str | None, procs: list[int], pairs: int) -> list[dict]:
    """The throughput table on the filesystem of `where` (None: the temp dir), printed as it is measured."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="ledger-bench-", dir=where) as base:
        print(f"claim+commit pairs per second and claim latency on {where or tempfile.gettempdir()}, before issue 17\n"
              "(bef6541's listing) and after, beside the filesystem's floor (temp write + fsync + rename), the same\n"
              "number of processes")
        print(f"{'procs':>5} {'floor ops/s':>12} {'floor p99':>10} {'before/s':>9} {'p99 ms':>7} "
              f"{'after/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'p99 after/before':>17}")
        for n in procs:
            r = measure(Path(base), n, pairs)
            rows.append(r)
            b, a = r["before"], r["after"]
            print(f"{n:>5} {r['floor_ops_per_s']:>12.0f} {r['floor_op_p99_ms']:>10.2f} {b['pairs_per_s']:>9.0f} "
                  f"{b['claim_p99_ms']:>7.2f} {a['pairs_per_s']:>8.0f} {a['claim_p50_ms']:>7.2f} "
                  f"{a['claim_p99_ms']:>7.2f} {a['claim_p99_ms'] / max(b['claim_p99_ms'], 1e-3):>16.2f}x",
                  flush=True)
        print(f"targets: >= {TARGET_PAIRS_PER_S} pairs/s at 32 processes, p99 claim <= {TARGET_P99_MS} ms\n")
    return rows


def print_shared_vs_local(shared: str, rows: list[dict], local: str, beside: list[dict]) -> None:
    print(f"today's claim+commit on {shared} beside {local}")
    print(f"{'procs':>5} {'pairs/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'beside/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'ratio':>6}")
    for r, b in zip(rows, beside, strict=True):
        a, c = r["after"], b["after"]
        print(f"{r['procs']:>5} {a['pairs_per_s']:>8.0f} {a['claim_p50_ms']:>7.2f} {a['claim_p99_ms']:>7.2f} "
              f"{c['pairs_per_s']:>9.0f} {c['claim_p50_ms']:>7.2f} {c['claim_p99_ms']:>7.2f} "
              f"{a['pairs_per_s'] / c['pairs_per_s']:>5.2f}x")
    print(f"target: >= {TARGET_SHARED_RATIO}x at {SHARED_RATIO_PROCS} processes\n")


if __name__ == "__main__":
    sys.exit(main())
