"""A run's launch state (its roles, their restarts and exit codes) and its training progress: the newest
rollout, checkpoint and eval.
"""

from __future__ import annotations

import argparse
import sys
import time

from hpc.records import RecordError
from hpc.runlayout import RunDirError, RunLayout


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the run directory")
    p.add_argument("--ttl", type=float, default=30.0, help="seconds without heartbeat before a task is down")


def open_run(path: str) -> RunLayout | None:
    try:
        return RunLayout.open(path)
    except (RunDirError, RecordError) as e:
        print(e, file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    from hpc.launch.state import read_driver_records, read_end, read_launch_record, read_task_records
    from hpc.registry import Registry, task_role

    layout = open_run(args.run)
    if layout is None:
        return 2
    rec = read_launch_record(layout)
    if rec is None:
        print(f"{layout.root}: never launched")
        return 0
    end = read_end(layout)
    state, message = (end.state, end.message) if end else (rec.state, rec.message)
    drivers = read_driver_records(layout)
    if not end and drivers:
        state = "running" if any(d.state == "running" for d in drivers.values()) else state
    age = time.time() - (end.ended if end else rec.updated)
    print(f"run {layout.manifest().run_id}: {state} ({rec.executor}"
          f"{', job ' + rec.job_id if rec.job_id else ''}; updated {age:.0f} s ago)"
          f"{': ' + message if message else ''}")
    for name, d in drivers.items():
        print(f"  driver {name}: {d.state} (job {d.job_id}){': ' + d.message if d.message else ''}")
    alive = {(s.role, s.index) for s in Registry(layout.services_dir).alive(ttl_s=args.ttl)}
    print(f"{'task':<16} {'state':<8} {'up':<4} {'restarts':>8} {'exit':>5} {'node':<10}")
    for t in read_task_records(layout):
        up = "yes" if t.state == "running" and (task_role(t.role), t.index) in alive else "no"
        code = "" if t.exit_code is None else str(t.exit_code)
        print(f"{t.role + '-' + str(t.index):<16} {t.state:<8} {up:<4} {t.restarts:>8} {code:>5} {t.node:<10}")
    for line in _progress(layout):
        print(line)
    return 0


def _progress(layout: RunLayout) -> list[str]:
    """The training side of a run: its newest rollout, checkpoint and eval."""
    import json

    from hpc.ledger import Ledger

    lines = []
    if (layout.ledger_dir / "ledger.json").exists():
        ledger = Ledger(layout.ledger_dir)
        rollouts = ledger.rollouts()
        if rollouts:
            st = ledger.status(rollouts[-1])
            lines.append(f"rollout {st.rollout_id}: {'closed' if st.closed else 'open'}, "
                         f"{len(st.complete_groups)} groups complete; attempts {st.committed} committed, "
                         f"{st.claimed} running, {st.pending} pending, {st.failed} failed, of {st.total}")
    latest = layout.latest_checkpoint()
    lines.append(f"latest checkpoint: {f'iter_{latest}' if latest is not None else 'none yet'}")
    scored = sorted((int(p.parent.name.removeprefix("iter_")), p) for p in layout.root.glob("eval/iter_*/summary.json")
                    if p.parent.name.removeprefix("iter_").isdigit())
    if scored:
        n, path = scored[-1]
        summary = json.loads(path.read_text())
        lines.append(f"last eval: iter_{n}, pass@1 {summary.get('pass@1')}, pass@{summary.get('k')} "
                     f"{summary.get('pass@k')} over {summary.get('attempts')} attempts")
    else:
        lines.append("last eval: none yet")
    return lines
