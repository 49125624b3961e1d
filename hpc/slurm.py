"""Every Slurm client command the toolkit runs, in one place: sbatch, squeue, scancel, scontrol, sinfo.

As submitit keeps its Slurm calls in its Slurm classes: callers ask a question (is the job queued?) or
give an order (cancel these steps), never build a command line. A command that is not installed raises
SlurmUnavailable, naming it; an order Slurm refuses raises SlurmError with Slurm's own words. Queries
that are only hints (is it still queued?) answer "nothing" when Slurm does not answer, as the callers
say. srun is not here: a job step's command line is the launch plan's (hpc/launch/steps.py).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

QUERY_TIMEOUT_S = 30.0      # slurmctld answers in well under a second; a hung one must not hang a driver


class SlurmUnavailable(RuntimeError):
    """A Slurm command is missing or slurmctld does not answer."""


class SlurmError(RuntimeError):
    """Slurm refused an order (sbatch, scancel, scontrol); the message holds its words."""


def _run(argv: Sequence[str], timeout_s: float | None = QUERY_TIMEOUT_S) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise SlurmUnavailable(f"{argv[0]} is not installed or not on PATH: run this where Slurm's client "
                               "commands are (a login node), or `module load slurm`") from None
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{argv[0]} did not answer within {timeout_s:g} s: is slurmctld up?") from None


def sbatch(script: Path, *options: str) -> str:
    """Submit `script` with sbatch's `options`; the job id."""
    r = _run(["sbatch", "--parsable", *options, str(script)], timeout_s=None)
    if r.returncode != 0:
        raise SlurmError(f"sbatch refused {script}: {r.stderr.strip()}")
    return r.stdout.strip().split(";")[0]


def queued(job_ids: str, *, array_tasks: bool = False) -> list[str]:
    """The jobs of `job_ids` (comma-separated) still pending or running, with array_tasks one id per
    array task; [] when none is, or when squeue does not answer (a hint, never an order)."""
    argv = ["squeue", "-h", "-j", job_ids, "-o", "%i" if array_tasks else "%A", *(["-r"] if array_tasks else [])]
    try:
        r = _run(argv)
    except SlurmUnavailable:
        return []
    return r.stdout.split() if r.returncode == 0 else []


def job_steps(job_id: str) -> list[tuple[str, str]]:
    """(step id, step name) of each of the job's running steps; [] when squeue does not answer."""
    try:
        r = _run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"])
    except SlurmUnavailable:
        return []
    return [(step, name.strip()) for step, name in
            (line.split(maxsplit=1) for line in r.stdout.splitlines() if " " in line)]


def scancel(ids: Sequence[str], *, signal: str | None = None, check: bool = True) -> None:
    """Cancel jobs or steps (`JOB` or `JOB.STEP`), or with `signal` (TERM, USR2...) only signal them.
    check=False: a best effort (a step may have ended meanwhile), never raising."""
    try:
        r = _run(["scancel", *([f"--signal={signal}"] if signal else []), *ids])
    except SlurmUnavailable:
        if check:
            raise
        return
    if check and r.returncode != 0:
        raise SlurmError(f"scancel {' '.join(ids)} failed: {r.stderr.strip()}")


def requeue(job_id: str) -> None:
    """Put a batch job back in the queue (its driver asked for it before its time limit); best effort."""
    try:
        _run(["scontrol", "requeue", job_id])
    except SlurmUnavailable:
        pass


def node_address(name: str) -> str:
    """The NodeAddr slurmctld knows for node `name`; ValueError with scontrol's words if it has none."""
    try:
        r = _run(["scontrol", "show", "node", "-o", name])
    except SlurmUnavailable as e:
        raise ValueError(f"cannot resolve Slurm node {name!r}: not in DNS, and {e}") from None
    m = re.search(r"\bNodeAddr=(\S+)", r.stdout)
    if r.returncode != 0 or not m:
        raise ValueError(f"cannot resolve Slurm node {name!r}: not in DNS, and scontrol said "
                         f"{(r.stderr or r.stdout).strip()!r}")
    return m.group(1)


def node_lines() -> str:
    """`sinfo -h -N -o "%P %N %c %m %G"`: one line per (partition, node) (hpc.launch.slurminfo reads it)."""
    try:
        r = _run(["sinfo", "-h", "-N", "-o", "%P %N %c %m %G"], timeout_s=60)
    except SlurmUnavailable as e:
        raise SlurmUnavailable(f"{e}; or give the plan its `partitions:` in the config") from None
    if r.returncode != 0:
        raise SlurmUnavailable(f"sinfo failed ({r.stderr.strip()}); is SLURM_CONF right and slurmctld up?")
    return r.stdout
