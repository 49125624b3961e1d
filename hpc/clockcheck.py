"""Is this node's clock close enough to the shared filesystem's for the ledger's leases?

A lease's deadline is the claimant's clock plus the lease, stored as a file's mtime and read against
the reader's clock: two nodes whose clocks differ by S see each other's leases S seconds early or
late. A node that runs 2 leases fast takes over every live claim; fencing keeps each attempt to one
commit, but the work is done twice. One node sees only its own clock against the filesystem's (the
server stamps a file created there), and if every node is within S of it, no two are more than 2S
apart: each role that claims (hpc.claims.ClaimLoop) checks at its start, says so past a fraction of
the lease, and refuses to start past a hard bound.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from .fsio import temp_path

log = logging.getLogger("hpc.clock")
WARN_FRACTION = 0.1       # of the lease: said at start
REFUSE_FRACTION = 0.5     # of the lease: the role does not start
_FIX = "keep the nodes' clocks in sync with NTP (chronyd or systemd-timesyncd; `chronyc tracking` shows the offset)"


class ClockSkewError(RuntimeError):
    """This node's clock is too far from the shared filesystem's for its leases."""


def filesystem_skew(directory: Path | str, clock: Callable[[], float] = time.time) -> float:
    """The filesystem's clock minus ours (seconds), from the mtime of a file created in `directory` now."""
    path = temp_path(Path(directory) / "clock-probe")
    before = clock()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"probe")       # a write: the server stamps the file's mtime now
        mtime = os.fstat(fd).st_mtime
        after = clock()
    finally:
        os.close(fd)
        os.unlink(path)
    return mtime - (before + after) / 2


def verdict(skew_s: float, lease_s: float) -> tuple[str, str | None]:
    """("ok" | "warn" | "refuse", what to say) for a skew against a lease (pure)."""
    if abs(skew_s) < WARN_FRACTION * lease_s:
        return "ok", None
    side = "behind" if skew_s > 0 else "ahead of"
    said = (f"this node's clock is {abs(skew_s):.1f} s {side} the shared filesystem's, against a lease of "
            f"{lease_s:g} s: ")
    if abs(skew_s) < REFUSE_FRACTION * lease_s:
        return "warn", said + f"its claims may be taken over early, or others' late; {_FIX}"
    return "refuse", (said + f"more than {REFUSE_FRACTION:g} of a lease, so its claims would be taken over (or "
                      f"take over others') while their work runs; {_FIX}, or raise the lease (pool.lease_s)")


def check_clock(directory: Path | str, lease_s: float, clock: Callable[[], float] = time.time) -> float:
    """The skew of this node's clock against the filesystem under `directory`; logs a warning past
    WARN_FRACTION of the lease and raises ClockSkewError past REFUSE_FRACTION."""
    skew = filesystem_skew(directory, clock)
    level, said = verdict(skew, lease_s)
    if level == "refuse":
        raise ClockSkewError(f"{directory}: {said}")
    if level == "warn":
        log.warning("%s: %s", directory, said)
    return skew
