"""Stop a run: scancel its Slurm jobs, or send SIGTERM to its local driver."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from .status import open_run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the run directory")


def run(args: argparse.Namespace) -> int:
    from hpc import slurm
    from hpc.launch.state import read_end, read_launch_record
    from hpc.slurm import SlurmError, SlurmUnavailable

    layout = open_run(args.run)
    if layout is None:
        return 2
    rec = read_launch_record(layout)
    end = read_end(layout)
    if rec is None or end is not None:
        print(f"{layout.root}: nothing to stop ({end.state if end else 'never launched'})")
        return 0
    if rec.job_id:
        try:
            slurm.scancel(rec.job_id.split(","))
        except (SlurmError, SlurmUnavailable) as e:
            print(f"agentrl stop: {e}", file=sys.stderr)
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
