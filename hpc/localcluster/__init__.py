"""A real Slurm cluster on one machine (munged, slurmctld, three slurmd), for tests and trials.

cluster.sh does the work; slurm.conf.in and gres.conf.in beside it are the templates it renders.
They are package data, so `agentrl cluster` runs the same from an installed wheel as from a checkout.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

CLUSTER_SCRIPT = Path(__file__).resolve().with_name("cluster.sh")
ACTIONS = ("up", "down", "status", "env")


def run(action: str) -> int:
    """`cluster.sh ACTION` (one of ACTIONS); its output goes to this process's stdout and stderr."""
    if action not in ACTIONS:
        raise ValueError(f"unknown local cluster action {action!r}; known: {', '.join(ACTIONS)}")
    # bash by name: the wheel keeps the script's execute bit only where the installer honours it.
    return subprocess.call(["bash", str(CLUSTER_SCRIPT), action])
