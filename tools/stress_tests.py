"""Run the non-slow tests several times with every core under a busy loop: a timing bound that only holds
on a quiet machine fails here (docs/testing.md, "Under load").

    python tools/stress_tests.py [--runs 3] [--spinners N] [--log FILE] [-- PYTEST_ARGS...]

Each run is `pytest -m "not slow"` (what `make test-fast` runs) beside N processes spinning at the
tests' own priority (default: one per core). One line per run, then the total; exit 1 if any run failed.
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


def run_once(pytest_args: list[str]) -> tuple[dict[str, int], float, list[str]]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "pytest", "-m", "not slow", "-q", "-p", "no:cacheprovider",
                        *pytest_args], cwd=ROOT, capture_output=True, text=True)
    took = time.monotonic() - t0
    lines = p.stdout.strip().splitlines()
    failed = [line.split(" - ")[0] for line in lines if line.startswith(("FAILED ", "ERROR "))]
    found = counts(lines[-1]) if lines else {}
    if p.returncode not in (0, 1) or not found:
        failed.append(f"pytest exited {p.returncode}: {(p.stdout + p.stderr)[-2000:]}")
    return found, took, failed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(prog="stress_tests.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--spinners", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    ap.add_argument("--log", type=Path, help="append one JSON line per run here")
    args = ap.parse_args(ours)
    if args.runs < 1 or args.spinners < 0:
        ap.error(f"--runs must be at least 1 and --spinners at least 0, got {args.runs} and {args.spinners}")
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.spinners)]
    bad = 0
    try:
        print(f"{args.runs} runs of pytest -m 'not slow' {' '.join(pytest_args)} beside {args.spinners} busy "
              f"processes on {os.cpu_count()} cores", flush=True)
        for i in range(1, args.runs + 1):
            found, took, failed = run_once(pytest_args)
            bad += bool(failed)
            print(f"run {i}: {took / 60:.1f} min, " + ", ".join(f"{n} {k}" for k, n in found.items())
                  + "".join(f"\n  {f}" for f in failed), flush=True)
            if args.log:
                with args.log.open("a") as f:
                    f.write(json.dumps({"run": i, "seconds": round(took, 1), "counts": found, "failed": failed,
                                        "spinners": args.spinners, "cores": os.cpu_count(),
                                        "pytest_args": pytest_args}) + "\n")
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    print(f"{args.runs - bad} of {args.runs} runs without a failure")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
