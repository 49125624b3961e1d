"""Progress of every rollout in a run's ledger: attempts committed, claimed, pending and failed, and the
groups complete.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a run directory, or its ledger/ directory")
    p.add_argument("--json", action="store_true", help="print one JSON list instead of a table")


def run(args: argparse.Namespace) -> int:
    from hpc.ledger import Ledger, LedgerError
    from hpc.records import RecordError
    from hpc.runlayout import RunLayout

    root = Path(args.path)
    if RunLayout.holds_run(root):
        root = RunLayout(root).ledger_dir
    if not (root / "ledger.json").exists():
        print(f"{root} holds no ledger (no ledger.json): pass a run directory or its ledger/", file=sys.stderr)
        return 2
    try:
        led = Ledger(root)
        rows = [asdict(led.status(r)) for r in led.rollouts()]
    except (LedgerError, RecordError) as e:
        print(e, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'rollout':>7} {'gen':>4} {'closed':>6} {'total':>6} {'done':>6} {'claimed':>7} "
          f"{'pending':>7} {'failed':>6}  complete groups")
    for r in rows:
        print(f"{r['rollout_id']:>7} {r['generation']:>4} {str(r['closed']):>6} {r['total']:>6} "
              f"{r['committed']:>6} {r['claimed']:>7} {r['pending']:>7} {r['failed']:>6}  "
              f"{len(r['complete_groups'])}")
    return 0
