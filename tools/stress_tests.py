"""Run the non-slow tests several times with every core under a busy loop: a timing bound that only holds
on a quiet machine fails here (docs/testing.md, "Under load").

    python tools/stress_tests.py [--runs 3] [--spinners N] [--workers 2] [--log FILE] [-- PYTEST_ARGS...]

Each run is the non-slow tests as `make test` runs them (on --workers pytest-xdist workers, a module's
tests on one, then the tests marked alone one at a time) beside N processes spinning at the tests' own
priority (default: one per core). One line per run, then the total; exit 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPIN = "while True: pass"


def counts(summary: str) -> dict[str, int]:
    """pytest's closing line ("1 failed, 1290 passed, 3 skipped in 600.00s") as counts."""
    return {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)",
                                                  summary)}


def parts(workers: int) -> list[list[str]]:
    """make test's two parts, the slow tests left out."""
    spread = ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []
    return [[*spread, "-m", "not slow and not alone"], ["-m", "alone and not slow"]]


def run_once(workers: int, pytest_args: list[str],
             keep: Path | None = None) -> tuple[dict[str, int], float, list[str], list[str]]:
    """(counts, seconds, what failed, what skipped and why) of one run, both parts; each part's whole output
    into KEEP.partN.txt where KEEP is given (a failure under load is rarely reproduced alone)."""
    t0 = time.monotonic()
    found: dict[str, int] = {}
    failed, skipped = [], []
    for n, part in enumerate(parts(workers), 1):
        p = subprocess.run([sys.executable, "-m", "pytest", *part, "-q", "-p", "no:cacheprovider", *pytest_args],
                           cwd=ROOT, capture_output=True, text=True)
        if keep is not None:
            Path(f"{keep}.part{n}.txt").write_text(p.stdout + p.stderr)
        lines = p.stdout.strip().splitlines()
        failed += [line.split(" - ")[0] for line in lines if line.startswith(("FAILED ", "ERROR "))]
        skipped += [line for line in lines if line.startswith("SKIPPED ")]
        these = counts(lines[-1]) if lines else {}
        for kind, count in these.items():
            found[kind] = found.get(kind, 0) + count
        if p.returncode not in (0, 1, 5) or (not these and p.returncode != 5):   # 5: nothing selected
            failed.append(f"pytest exited {p.returncode}: {(p.stdout + p.stderr)[-2000:]}")
    return found, time.monotonic() - t0, failed, skipped


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(prog="stress_tests.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--spinners", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers, as make test's TEST_WORKERS")
    ap.add_argument("--log", type=Path, help="append one JSON line per run here (each run's output beside it)")
    args = ap.parse_args(ours)
    if args.runs < 1 or args.spinners < 0 or args.workers < 1:
        ap.error(f"--runs and --workers must be at least 1 and --spinners at least 0, got {args.runs}, "
                 f"{args.workers} and {args.spinners}")
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.spinners)]
    bad = 0
    try:
        print(f"{args.runs} runs of the non-slow tests on {args.workers} workers {' '.join(pytest_args)} beside "
              f"{args.spinners} busy processes on {os.cpu_count()} cores", flush=True)
        for i in range(1, args.runs + 1):
            keep = args.log.with_name(f"{args.log.stem}.run{i}") if args.log else None
            found, took, failed, skipped = run_once(args.workers, pytest_args, keep)
            bad += bool(failed)
            print(f"run {i}: {took / 60:.1f} min, " + ", ".join(f"{n} {k}" for k, n in found.items())
                  + "".join(f"\n  {f}" for f in failed + skipped), flush=True)
            if args.log:
                with args.log.open("a") as f:
                    f.write(json.dumps({"run": i, "seconds": round(took, 1), "counts": found, "failed": failed,
                                        "skipped": skipped, "spinners": [s.pid for s in spinners],
                                        "workers": args.workers, "cores": os.cpu_count(),
                                        "pytest_args": pytest_args}) + "\n")
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    print(f"{args.runs - bad} of {args.runs} runs without a failure")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
