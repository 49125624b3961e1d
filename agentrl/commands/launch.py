"""Validate the config's launch plan, then run it as an sbatch het job, through submitit, or as local
processes. A run directory that holds the run already continues it, from its latest checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpc.records import RecordError
from hpc.runlayout import RunDirError, RunLayout


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="run config (YAML with a launch: section)")
    p.add_argument("--executor", choices=["sbatch", "submitit", "local"], default="local")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would run (the sbatch script, or the plan) and submit nothing")
    p.add_argument("--run-dir", help="the run directory (default: run_dir: of the config); one that holds the run "
                                     "already continues it, from its latest checkpoint")
    p.add_argument("--accept-changes", action="store_true",
                   help="continue a run whose config changed in what may change (train.num_rollouts, time "
                        "limits, resources, eval); anything else is refused")
    p.add_argument("--python", help="interpreter for the roles (default: this one)")


def run(args: argparse.Namespace) -> int:
    from hpc.launch import executors
    from hpc.launch.sbatch import render_sbatch
    from hpc.launch.slurminfo import SlurmUnavailable, partitions_from_sinfo

    from ..run_config import load_run_config, read_config_file

    try:
        config = read_config_file(Path(args.config))
        section = config.get("launch") if isinstance(config, dict) else None
        partitions = None
        if isinstance(section, dict) and "partitions" not in section:
            partitions = partitions_from_sinfo()
        # Every section, launch: with the others and every problem at once, before anything is submitted:
        # a bad eval: would otherwise surface after training. The resolved config is what the roles read.
        # A dry run previews the plan before the paths exist (off the cluster, say): what is missing is a warning.
        checked = load_run_config(config, Path(args.config).resolve().parent, str(args.config),
                                  partitions=partitions, check_launch=True, check_paths=not args.dry_run)
        resolved, plan = checked.raw, checked.plan
        assert plan is not None     # check_launch: a plan, or RunConfigError
    except (ValueError, SlurmUnavailable) as e:  # PlanError and RunConfigError are ValueErrors
        print(e, file=sys.stderr)
        return 2
    from ..pool.config import moved_to_adapter
    for where, section in (("pool", config.get("pool")), ("eval.pool", (config.get("eval") or {}).get("pool"))):
        if moved := moved_to_adapter(section):
            print(f"agentrl: warning: {where}: {', '.join(moved)} now go under {where}.adapter: (read from {where} "
                  "for runs made before; move them there)", file=sys.stderr)
    if checked.train is not None:
        from ..swe.history import keep_warning
        if warning := keep_warning(checked.train.prompt_data):
            print(f"agentrl: warning: {warning}", file=sys.stderr)
    if args.dry_run:
        for problem in checked.missing_paths:
            print(f"agentrl: warning: {problem}; a launch refuses this until it exists", file=sys.stderr)
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
        if RunLayout.holds_run(Path(run_dir)):
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

    from ..run_config import config_changes, describe_changes, refused_changes, resolve_paths

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
