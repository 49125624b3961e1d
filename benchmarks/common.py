"""What every benchmark computes the same way, so that their figures compare."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterable


def percentile(xs: Iterable[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of `xs` by linear interpolation between the closest ranks: numpy's
    default (`np.quantile(xs, q)`, method "linear"), so p50 is statistics.median and a p99 reads as
    everyone else's. Raises ValueError on no values or q outside [0, 1]."""
    values = sorted(xs)
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 1:
        raise ValueError(f"q must be within [0, 1], got {q!r}")
    pos = q * (len(values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def stop(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """End a child still running (interrupted: ^C, a test's timeout): SIGTERM, so that a launcher stops the
    roles it started, then SIGKILL after grace_s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
