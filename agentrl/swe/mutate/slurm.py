"""Validation on Slurm: each batch of runs one job array, a task per result file, at most --parallelism at once.

    OUT/.mutations/<project>-<digest>/batches/<stamp>/
        repo/            the project's tree as every sandbox starts from it
        jobs.json        the suite's spec, and for array task i: its result file, diff and runs
        <i>.diff         task i's mutation (empty: the clean tree)
        job.sbatch       the array (hpc/images/array.py); <i>.out its output, <i>.json its outcome

Array task i runs `python -m agentrl.swe.mutate.slurm BATCH --job-index i` on its node: one sandbox,
the same runs as the local path (runner.run_jobs), its result written to the same file. So the
verdicts, the kept set and the tasks are the same whichever ran them, and a re-run submits only the
candidates without a result. The submitter watches the array's outcomes (built: a candidate's runs
done; failed: its sandbox could not run) and fails naming the first failure's output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hpc.fsio import write_atomic
from hpc.images.array import JobOutcome, array_script, job_alive, submit, watch, write_outcome
from hpc.images.cache import ImageCache
from hpc.sandbox.base import SandboxError

from ..loaded import materialize
from ..task import HOST_IMAGE, Resources, TaskSpec
from .runner import Job, read_result, run_jobs, suite_spec
from .verdict import Run, baseline, judge


def submit_batch(work: Path, repository: dict[str, bytes], spec: TaskSpec, todo: list[Job], *, parallelism: int,
                 timeout_s: float, scratch: str | None, sbatch_options: Sequence[str] = (),
                 image_cache: Path | None = None,
                 submit: Callable[[Path], str] = submit, alive: Callable[[str], bool] = job_alive,
                 poll_s: float = 2.0) -> None:
    """Every job's result file, made by one job array; SandboxError naming what failed. A job whose
    `again` is set is confirmed as the local path confirms it: by the baseline in WORK/clean.json."""
    if not todo:
        return
    batch = work / "batches" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    materialize(repository, batch / "repo")
    jobs = []
    for i, job in enumerate(todo):
        write_atomic(batch / f"{i}.diff", job.diff)
        jobs.append({"result": str(job.path.resolve()), "runs": job.runs, "confirm": job.again is not None})
    write_atomic(batch / "jobs.json", json.dumps({
        "name": spec.instance_id.removeprefix("validate-"), "timeout_s": timeout_s, "scratch": scratch,
        "image": spec.image, "image_cache": str(image_cache.resolve()) if image_cache else None,
        "eval_command": spec.eval_command,
        "cpus": spec.resources.cpus, "mem_mb": spec.resources.mem_mb, "clean": str((work / "clean.json").resolve()),
        "jobs": jobs}, indent=1).encode())
    script = batch / "job.sbatch"
    script.write_text(array_script(["-m", "agentrl.swe.mutate.slurm", str(batch.resolve())], range(len(todo)),
                                   parallelism, batch.resolve(), job_name="agentrl-mutations",
                                   sbatch_options=sbatch_options))
    job_id = submit(script)
    print(f"submitted {len(todo)} validation runs as job {job_id}; output in {batch}", file=sys.stderr, flush=True)
    done = watch(batch, range(len(todo)), {i: job.path.stem for i, job in enumerate(todo)},
                 lambda: alive(job_id), poll_s=poll_s)
    failed = sorted((o for o in done.values() if o.outcome == "failed"), key=lambda o: o.index)
    if failed:
        first = failed[0]
        raise SandboxError(f"{len(failed)} of {len(todo)} validation runs in job {job_id} failed; the first, "
                           f"candidate {first.name}: {first.message} (its output: {batch / f'{first.index}.out'})")


def run_task(batch: Path, index: int, outcomes: Path) -> int:
    """Array task `index` of the batch: its runs in one sandbox on this node, and its outcome."""
    data = json.loads((batch / "jobs.json").read_text())
    if not 0 <= index < len(data["jobs"]):
        raise SystemExit(f"{batch / 'jobs.json'}: has {len(data['jobs'])} jobs, not --job-index {index}")
    entry = data["jobs"][index]
    again: Callable[[Run], bool] | None = None
    if entry["confirm"]:      # the local path's own test (build.validate): a mutant that would be kept runs again
        base = baseline(read_result(Path(data["clean"])) or [])

        def again(run: Run) -> bool:
            return judge(base, run).kept
    spec = suite_spec(data["name"], data["timeout_s"], Resources(cpus=data["cpus"], mem_mb=data["mem_mb"]),
                      data.get("image") or HOST_IMAGE).model_copy(update={"eval_command": data["eval_command"]})
    cache = ImageCache(data["image_cache"]) if data.get("image_cache") else None
    repo = batch / "repo"
    repository = {p.relative_to(repo).as_posix(): p.read_bytes() for p in sorted(repo.rglob("*")) if p.is_file()}
    job = Job(Path(entry["result"]), (batch / f"{index}.diff").read_bytes(), entry["runs"], again)
    name = job.path.stem
    try:
        run_jobs(repository, spec, [job], workers=1, timeout_s=data["timeout_s"], scratch=data["scratch"],
                 cache=cache)
        outcome = JobOutcome(index=index, name=name, outcome="built", message=str(job.path))
    except (SandboxError, OSError) as e:
        outcome = JobOutcome(index=index, name=name, outcome="failed", message=str(e))
    print(f"{outcome.outcome}: {outcome.message}", file=sys.stderr, flush=True)
    write_outcome(outcomes, outcome)
    return 0 if outcome.outcome == "built" else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentrl.swe.mutate.slurm",
                                description="one array task of a validation batch (submit_batch writes the batch)")
    p.add_argument("batch", type=Path)
    p.add_argument("--job-index", type=int, required=True)
    p.add_argument("--outcomes", type=Path, required=True)
    args = p.parse_args(argv)
    return run_task(args.batch, args.job_index, args.outcomes)


if __name__ == "__main__":
    sys.exit(main())
