"""`agentrl launch`, `agentrl status`, `agentrl stop`: thin shells over hpc.launch."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpc.launch.plan import load_plan
from hpc.records import RecordError
from hpc.runlayout import RunDirError, RunLayout


def launch(args: argparse.Namespace) -> int:
    from hpc.launch import executors
    from hpc.launch.sbatch import render_sbatch
    from hpc.launch.slurminfo import SlurmUnavailable, partitions_from_sinfo

    from .run_config import load_run_config

    try:
        config = executors.load_config(Path(args.config))
        section = config["launch"]
        partitions = None
        if isinstance(section, dict) and "partitions" not in section:
            partitions = partitions_from_sinfo()
        # Every section, launch: with the others and every problem at once, before anything is submitted:
        # a bad eval: would otherwise surface after training. The resolved config is what the roles read.
        resolved = load_run_config(config, Path(args.config).resolve().parent, str(args.config),
                                   partitions=partitions, check_launch=True).raw
        plan = load_plan(section, partitions)
    except (ValueError, SlurmUnavailable) as e:  # PlanError and RunConfigError are ValueErrors
        print(e, file=sys.stderr)
        return 2
    if args.dry_run:
        if args.executor == "sbatch":
            print(render_sbatch(plan, source=str(args.config)))
        else:
            print(plan.model_dump_json(indent=2))
        return 0
    run_dir = args.run_dir or config.get("run_dir")
    if not run_dir:
        print("no run directory: pass --run-dir or set run_dir: in the config", file=sys.stderr)
        return 2
    config = {**resolved, "config_dir": str(Path(args.config).resolve().parent)}
    try:
        if (Path(run_dir) / "run.yaml").exists():
            layout = continue_run(Path(run_dir), config, accept_changes=args.accept_changes)
        else:
            layout = RunLayout.create(run_dir, config, run_id=config.get("run_id"))
    except (RunDirError, RecordError, ValueError) as e:
        print(e, file=sys.stderr)
        return 2
    python = args.python or sys.executable
    print(f"agentrl: run directory {layout.root}, executor {args.executor}, python {python}")
    print(f"agentrl: each task logs to {layout.logs_dir}/<role>-<i>.log; `agentrl status {layout.root}` and "
          f"`agentrl ledger status {layout.root}` show progress", flush=True)
    if args.executor == "local":
        return executors.run_local(plan, layout, python)
    if args.executor == "sbatch":
        job = executors.submit_sbatch(plan, layout, python, source=str(args.config))
        print(f"agentrl: submitted het job {job}; script {layout.root}/launch/job.sbatch")
        return 0
    ids = executors.submit_submitit(plan, layout, python)
    print(f"agentrl: submitted {len(ids)} submitit job(s): {', '.join(ids)}")
    return 0


def continue_run(run_dir: Path, config: dict, *, accept_changes: bool) -> RunLayout:
    """Launch an existing run again: from its latest checkpoint, with the config it has.

    A changed config is refused with what changed, unless accept_changes and every change is one a
    continued run may take (agentrl.run_config.MAY_CHANGE): then run.yaml takes the new config.
    """
    from hpc.launch.state import still_running

    from .run_config import config_changes, describe_changes, refused_changes, resolve_paths

    layout = RunLayout.open(run_dir, run_id=config.get("run_id"))
    if busy := still_running(layout):
        raise RunDirError(f"{layout.root}: {busy}; stop it first (`agentrl stop {layout.root}`) or let it end")
    manifest = layout.manifest()
    stored = resolve_paths(manifest.config, layout.config_base())    # a run.yaml of older code: relative paths
    changes = [c for c in config_changes(stored, config) if c[0] != "run_id"]
    if changes and not accept_changes:
        raise RunDirError(f"{layout.root} holds run {manifest.run_id!r} with another config; what differs "
                          f"(run.yaml -> this config):\n{describe_changes(changes)}\nrelaunch with the config the run "
                          "started with, pass --accept-changes (only for settings that may change, such as "
                          "train.num_rollouts), or give a new --run-dir")
    if refused := refused_changes(changes):
        raise RunDirError(f"{layout.root}: a continued run cannot change {', '.join(refused)} (what it trains on, "
                          "or how); start a new run in another --run-dir")
    if changes:
        layout.amend_config(config)
        print(f"agentrl: run {manifest.run_id}: its config changes:\n{describe_changes(changes)}")
    latest = layout.latest_checkpoint()
    print(f"agentrl: continuing run {manifest.run_id} from "
          f"{'checkpoint iter_' + str(latest) if latest is not None else 'its start (no checkpoint yet)'}")
    return layout


def _open(path: str) -> RunLayout | None:
    try:
        return RunLayout.open(path)
    except (RunDirError, RecordError) as e:
        print(e, file=sys.stderr)
        return None


def status(args: argparse.Namespace) -> int:
    from hpc.launch.state import read_driver_records, read_end, read_launch_record, read_task_records
    from hpc.registry import Registry, task_role

    layout = _open(args.run)
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


def stop(args: argparse.Namespace) -> int:
    from hpc.launch.state import read_end, read_launch_record

    layout = _open(args.run)
    if layout is None:
        return 2
    rec = read_launch_record(layout)
    end = read_end(layout)
    if rec is None or end is not None:
        print(f"{layout.root}: nothing to stop ({end.state if end else 'never launched'})")
        return 0
    if rec.job_id:
        r = subprocess.run(["scancel", *rec.job_id.split(",")], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"scancel failed: {r.stderr.strip()}", file=sys.stderr)
            return 1
        print(f"agentrl: cancelled job(s) {rec.job_id}")
        return 0
    if rec.driver_pid:
        try:
            os.kill(rec.driver_pid, signal.SIGTERM)
        except ProcessLookupError:
            print(f"driver pid {rec.driver_pid} is gone; the run ended without recording it", file=sys.stderr)
            return 1
        print(f"agentrl: sent SIGTERM to the local driver (pid {rec.driver_pid})")
    return 0


def add_parsers(sub) -> None:
    la = sub.add_parser("launch", help="launch a run's roles from a config",
                        description="Validate the config's launch plan, then run it as an sbatch het job, "
                                    "through submitit, or as local processes.")
    la.add_argument("config", help="run config (YAML with a launch: section)")
    la.add_argument("--executor", choices=["sbatch", "submitit", "local"], default="local")
    la.add_argument("--dry-run", action="store_true",
                    help="print what would run (the sbatch script, or the plan) and submit nothing")
    la.add_argument("--run-dir", help="the run directory (default: run_dir: of the config); one that holds the run "
                                      "already continues it, from its latest checkpoint")
    la.add_argument("--accept-changes", action="store_true",
                    help="continue a run whose config changed in what may change (train.num_rollouts, time "
                         "limits, resources, eval); anything else is refused")
    la.add_argument("--python", help="interpreter for the roles (default: this one)")
    la.set_defaults(func=launch)

    st = sub.add_parser("status", help="a run's launch state: roles, restarts, exit codes")
    st.add_argument("run", help="the run directory")
    st.add_argument("--ttl", type=float, default=30.0, help="seconds without heartbeat before a task is down")
    st.set_defaults(func=status)

    sp = sub.add_parser("stop", help="stop a run: scancel its jobs, or signal its local driver")
    sp.add_argument("run", help="the run directory")
    sp.set_defaults(func=stop)
