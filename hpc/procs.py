"""Process groups: stop them whole, and find what survived."""

from __future__ import annotations

import os
import signal
import time


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True   # alive, someone else's
    return True


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, grace_s: float = 10.0) -> bool:
    """SIGTERM the group, then SIGKILL whatever is left after `grace_s`. True if the group is gone."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.02)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    # SIGKILL is not instant: give the kernel a moment to reap before calling it a survivor.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.02)
    return False
