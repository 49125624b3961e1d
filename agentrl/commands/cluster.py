"""A real Slurm cluster on this machine, for tests and trials: munge + slurmctld + slurmd for nodes gpu1
(4 GPUs), cpu1, cpu2. State lives in $AGENTRL_CLUSTER_DIR (default ~/.local/state/agentrl/local-cluster).
"""

from __future__ import annotations

import argparse

from hpc import localcluster


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=localcluster.ACTIONS,
                   help="up: start and wait for idle nodes (idempotent); down: stop what up started; "
                        "status: daemons and sinfo; env: the SLURM_CONF export line")


def run(args: argparse.Namespace) -> int:
    return localcluster.run(args.action)
