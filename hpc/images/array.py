"""A data set's images built by one Slurm job array: bounded parallelism, resumable, watched to the end.

    CACHE/builds/<id>/job.sbatch     the array: task i runs COMMAND --job-index i --outcomes DIR
    CACHE/builds/<id>/<i>.json       what task i did (a JobOutcome record), written as it ends
    CACHE/builds/<id>/<i>.out        its output

Every task computes the same ordered list of builds from the same sources and does the i-th,
so nothing but the sources travels. Only the builds not in the cache are submitted, and the
cache publishes an image whole or not at all, so submitting again after a failure or a
cancel builds what is left and never uses a half-built image. The submitter watches the
outcomes appear (built, cached, failed, remaining) and ends with each failure's message and
output file; a task that died without an outcome (killed, out of memory, its node lost) is
a failure that names its output.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from hpc import slurm
from hpc.records import Record, RecordError, read_record, write_record

OUTCOMES = ("built", "cached", "failed")


class JobOutcome(Record):
    kind: Literal["image_build_outcome"] = "image_build_outcome"
    index: int
    name: str
    outcome: Literal["built", "cached", "failed"]
    message: str = ""


def outcome_path(outcomes: Path, index: int) -> Path:
    return outcomes / f"{index}.json"


def write_outcome(outcomes: Path, outcome: JobOutcome) -> None:
    outcomes.mkdir(parents=True, exist_ok=True)
    write_record(outcome_path(outcomes, outcome.index), outcome)


def array_script(command: Sequence[str], indices: Sequence[int], parallelism: int, outcomes: Path,
                 job_name: str = "agentrl-images", sbatch_options: Sequence[str] = ()) -> str:
    """An sbatch script whose array task i runs `$PYTHON COMMAND... --job-index i --outcomes DIR`, for
    each i of `indices`, at most `parallelism` at once. The Python comes from AGENTRL_PYTHON (default
    python3), as in the launch scripts."""
    if not indices:
        raise ValueError("no builds to submit")
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, got {parallelism}")
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --array={','.join(map(str, indices))}%{parallelism}",
        f"#SBATCH --output={outcomes}/%a.out",
        *(f"#SBATCH {opt}" for opt in sbatch_options),
        "set -euo pipefail",
        "PYTHON=${AGENTRL_PYTHON:-python3}",
        f'exec "$PYTHON" {shlex.join(command)} --job-index "$SLURM_ARRAY_TASK_ID" '
        f"--outcomes {shlex.quote(str(outcomes))}",
        ""])


def submit(script: Path) -> str:
    """sbatch the script; the job id. A refusal raises (SlurmError), with sbatch's words."""
    return slurm.sbatch(script)


def job_alive(job_id: str) -> bool:
    """Whether any task of the array is still pending or running (squeue lists it)."""
    return bool(slurm.queued(job_id, array_tasks=True))


def read_outcomes(outcomes: Path, indices: Sequence[int]) -> dict[int, JobOutcome]:
    out = {}
    for i in indices:
        try:
            out[i] = read_record(outcome_path(outcomes, i), JobOutcome)
        except (FileNotFoundError, RecordError):
            continue
    return out


def progress_line(done: dict[int, JobOutcome], total: int) -> str:
    counts = {k: sum(1 for o in done.values() if o.outcome == k) for k in OUTCOMES}
    return ", ".join(f"{counts[k]} {k}" for k in OUTCOMES) + f", {total - len(done)} remaining"


def watch(outcomes: Path, indices: Sequence[int], names: Mapping[int, str], alive: Callable[[], bool], *,
          poll_s: float = 5.0, sleep: Callable[[float], None] = time.sleep, out=sys.stderr) -> dict[int, JobOutcome]:
    """Wait for every task's outcome, showing progress as it changes; once the job is gone, a task
    without an outcome is a failure naming its output file. `names[i]` names build i."""
    shown = None
    while True:
        done = read_outcomes(outcomes, indices)
        running = alive() if len(done) < len(indices) else False
        if not running:
            done = read_outcomes(outcomes, indices)      # what ended between the two looks
            for i in indices:
                if i not in done:
                    done[i] = JobOutcome(index=i, name=names[i], outcome="failed",
                                         message=f"the task ended without an outcome (killed, out of memory, or "
                                                 f"its node lost): see {outcomes / f'{i}.out'}")
        line = progress_line(done, len(indices))
        if line != shown:
            print(line, file=out, flush=True)
            shown = line
        if not running:
            return done
        sleep(poll_s)
