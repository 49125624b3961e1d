"""Liveness: a role says it is alive by touching its heartbeat file; its task wrapper watches the file.

A process can be alive and stuck (a deadlock, a hung filesystem call, SIGSTOP): watching processes
does not see it. A role whose plan states `restart.liveness_s` gets a heartbeat file from its task
wrapper (hpc.launch.task, AGENTRL_HEARTBEAT_FILE, read by hpc.environment.RoleEnv) and must `beat()`
it from its work loop more often than that. The wrapper kills a task whose file is older than the
bound and exits HUNG_EXIT, and the role's restart policy applies as to any failure.
"""

from __future__ import annotations

import os
from pathlib import Path

HUNG_EXIT = 124        # the exit code of a task killed for a stale heartbeat (as timeout(1)'s)


def beat(path: Path | None) -> None:
    """Touch the heartbeat file: this role is alive. Nothing when the role is not watched (None)."""
    if path is not None:
        try:
            os.utime(path)
        except FileNotFoundError:
            Path(path).touch()


def silent_for(mtime: float, now: float) -> float:
    """How long a heartbeat last written at `mtime` has been silent."""
    return max(0.0, now - mtime)
