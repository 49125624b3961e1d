"""A real Slurm cluster on this machine, for tests and trials: munge + slurmctld + slurmd for nodes gpu1
(4 GPUs), cpu1, cpu2. State lives in $AGENTRL_CLUSTER_DIR (default ~/.local/state/agentrl/local-cluster).
With `up --shared`, a shared filesystem that each node mounts as a client of its own (hpc/localcluster).
"""

from __future__ import annotations

import argparse
import sys

from hpc import localcluster


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=localcluster.ACTIONS,
                   help="up: start and wait for idle nodes (idempotent); down: stop what up started; "
                        "status: daemons and sinfo; env: the SLURM_CONF export line")
    p.add_argument("--shared", action="store_true",
                   help="up: a GlusterFS volume as the nodes' shared filesystem, mounted at one path by this "
                        "machine and by each node as a client of its own (needs root and glusterfs-server; "
                        "make sysdeps); it stays until down")


def run(args: argparse.Namespace) -> int:
    if args.shared and args.action != "up":
        print(f"agentrl cluster: --shared goes with up, not {args.action}", file=sys.stderr)
        return 2
    return localcluster.run(args.action, shared=args.shared)
