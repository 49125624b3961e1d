"""Scratch directories on node-local disk, named by their owner so that leftovers can be reaped.

A sandbox's writable layers and its home live in `agentrl-<kind>.<host>.<pid>.<rand>`. Its
owner removes it at stop; if the owner is SIGKILLed (OOM killer, scancel --signal=KILL, node
drain) nothing does, and on a pool node that runs thousands of rollouts such leftovers fill
the disk. `reap_abandoned` removes those whose owner is a dead process of this host; every
runtime calls it before it makes its own, so the next sandbox on the node cleans up.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from ..procs import pid_alive

PREFIX = "agentrl-"


def make_scratch(kind: str, root: str | None) -> Path:
    """A new private directory under `root` (default: the temp dir) that names its owner."""
    if "." in kind:
        raise ValueError(f"scratch kind {kind!r} must not contain '.'")
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}.{socket.gethostname()}.{os.getpid()}.", dir=root))


def owner_of(name: str) -> tuple[str, int] | None:
    """(host, pid) from a scratch directory's name, or None if it is not one of ours."""
    if not name.startswith(PREFIX):
        return None
    head, _, rest = name[len(PREFIX):].partition(".")
    host, sep, tail = rest.rpartition(".")        # tail: the random suffix
    host, sep2, pid = host.rpartition(".")
    if not (head and sep and sep2 and host and tail and pid.isdigit()):
        return None
    return host, int(pid)


def reap_abandoned(root: str | None) -> list[Path]:
    """Remove scratch directories under `root` whose owner, a process of this host, is gone."""
    base = Path(root or tempfile.gettempdir())
    host = socket.gethostname()
    removed: list[Path] = []
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return removed
    for name in names:
        owner = owner_of(name)
        if owner is None or owner[0] != host or owner[1] == os.getpid() or pid_alive(owner[1]):
            continue
        path = base / name
        _force_rmtree(path)
        if not os.path.lexists(path):
            removed.append(path)
    return removed


def _force_rmtree(path: Path) -> None:
    # An overlay's work/work dir is mode 000 and an agent may leave read-only trees: as
    # root rmtree copes; unprivileged, make the dirs writable first.
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        subprocess.run(["chmod", "-R", "u+rwx", str(path)], capture_output=True)
        shutil.rmtree(path, ignore_errors=True)
