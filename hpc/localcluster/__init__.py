"""A real Slurm cluster on one machine (munged, slurmctld, three slurmd), for tests and trials.

cluster.sh does the work; slurm.conf.in and gres.conf.in beside it are the templates it renders.
They are package data, so `agentrl cluster` runs the same from an installed wheel as from a checkout.

`up --shared` gives the nodes a shared filesystem as a cluster's are: a GlusterFS volume
(glusterfs.py) under the cluster's directory, mounted at one path by this machine (the login node)
and by each node on its own, every slurmd in a mount namespace of its own where that path is the
node's own client, with its own caches. What a job on cpu1 writes there, a job on gpu1 sees through
the volume's server. Once made, the volume stays with the cluster until `down`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:       # imported where used: `python -m hpc.localcluster.glusterfs` runs it as __main__
    from . import glusterfs

CLUSTER_SCRIPT = Path(__file__).resolve().with_name("cluster.sh")
ACTIONS = ("up", "down", "status", "env")
SHARED_VOLUME = "shared"        # under the cluster's directory: the volume's brick, its mount, volume.json


def cluster_dir() -> Path:
    """Where cluster.sh keeps the cluster (its own default, read the same way)."""
    return Path(os.environ.get("AGENTRL_CLUSTER_DIR") or Path.home() / ".local/state/agentrl/local-cluster")


def shared_path(root: Path | None = None) -> Path | None:
    """The path every node of the cluster sees the shared volume at (None: the cluster has none)."""
    from . import glusterfs

    try:
        vol = glusterfs.Volume.load((root or cluster_dir()) / SHARED_VOLUME)
    except FileNotFoundError:
        return None
    return Path(vol.clients[0])


def _shared_volume(root: Path) -> glusterfs.Volume:
    """The cluster's volume, made unless it is up and mounted here (a reboot leaves its record, not its mount)."""
    from . import glusterfs

    where = root / SHARED_VOLUME
    if (where / glusterfs.STATE).exists():
        vol = glusterfs.Volume.load(where)
        if os.path.ismount(vol.clients[0]):
            return vol
        glusterfs.down(where)
    return glusterfs.up(where, clients=1)


def run(action: str, *, shared: bool = False) -> int:
    """`cluster.sh ACTION` (one of ACTIONS); its output goes to this process's stdout and stderr."""
    if action not in ACTIONS:
        raise ValueError(f"unknown local cluster action {action!r}; known: {', '.join(ACTIONS)}")
    from . import glusterfs

    root = cluster_dir()
    env = dict(os.environ)
    if action == "up" and (shared or shared_path(root)):
        try:
            vol = _shared_volume(root)
        except glusterfs.GlusterError as e:
            print(f"cluster: the shared filesystem did not start: {e}", flush=True)
            return 1
        # cluster.sh mounts it in each slurmd's namespace with this command (none of its words has a space)
        env["AGENTRL_CLUSTER_SHARED"] = vol.clients[0]
        env["AGENTRL_CLUSTER_MOUNT"] = " ".join(glusterfs.mount_argv(vol.name, vol.clients[0], vol.cache_s)[:-1])
    # bash by name: the wheel keeps the script's execute bit only where the installer honours it.
    rc = subprocess.call(["bash", str(CLUSTER_SCRIPT), action], env=env)
    if action == "down":
        glusterfs.down(root / SHARED_VOLUME)
    elif action in ("up", "status") and (path := shared_path(root)):
        print(f"shared filesystem: {path} on every node, each its own GlusterFS client", flush=True)
    return rc
