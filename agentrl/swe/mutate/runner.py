"""The I/O shell of validation: a project's test suite run in real sandboxes, each run's result a file.

Each worker holds one sandbox of the project (the `host` image, or the image of the project's --with
requirements: what its tasks will have) for many runs:
`episode.baseline` records the clean tree once, and before each run `episode.restore` puts the tree
back and applies the run's diff (none for a clean run), so a run starts from the tree a grader would
see and nothing a previous run wrote remains. The suite runs as the grader runs it (the same unittest
command line, as the non-root agent user). Results go to DIR/<id>.json with `write_atomic`: a run
cut short leaves no result, and a re-run does only the candidates without one.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpc.fsio import write_atomic
from hpc.images.cache import ImageCache
from hpc.sandbox.base import SandboxError

from .. import episode
from ..generate import shipped_grader, suite_command
from ..loaded import materialize
from ..sandboxes import task_sandbox
from ..task import HOST_IMAGE, Resources, TaskSpec, Timeouts
from .suite import TestLayout
from .verdict import Run, failure_excerpts

WORKDIR = "/testbed"


@dataclass(frozen=True)
class Job:
    """One result to make: `runs` runs of the suite with `diff` applied, into `path`, and one more when
    `again` says so of the first (a mutant that would be kept is confirmed in the same sandbox)."""
    path: Path
    diff: bytes
    runs: int = 1
    again: Callable[[Run], bool] | None = None


def suite_spec(name: str, timeout_s: float, resources: Resources, image: str = HOST_IMAGE,
               runner: str = "unittest", tests: TestLayout | None = None) -> TaskSpec:
    """The sandbox's spec: a task of the project with no bug, as a task's own would be (in its image); its
    eval_command is the suite's, as the grader runs it (over the layout's test directories)."""
    return TaskSpec(instance_id=f"validate-{name}", image=image, workdir=WORKDIR, prompt="validation",
                    eval_command=suite_command("python3", runner, tests),
                    timeouts=Timeouts(agent_s=timeout_s, eval_s=timeout_s), resources=resources)


def read_result(path: Path) -> list[Run] | None:
    """A result file's runs, or None when it is missing (or left by an older layout: run again)."""
    try:
        data = json.loads(path.read_text())
        return [Run.from_json(r) for r in data["runs"]]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None


async def _run_suite(sb, spec: TaskSpec, diff: bytes, timeout_s: float) -> Run:
    await episode.restore(sb, spec, diff)
    r = await sb.exec(spec.eval_command, user="agent", cwd=spec.workdir, timeout_s=timeout_s)
    log = (r.stdout + r.stderr).decode(errors="replace")
    runner = runner_of(spec)
    status, complete = shipped_grader()["parse"](log, runner)
    return Run(status, complete and not r.timed_out, r.timed_out, failure_excerpts(log, runner))


def runner_of(spec: TaskSpec) -> str:
    """Which of the grader's runners the spec's eval_command runs (suite_spec made it)."""
    return "pytest" if spec.eval_command[3:5] == ["-m", "pytest"] else "unittest"


async def _worker(repo: Path, spec: TaskSpec, jobs: asyncio.Queue, timeout_s: float, scratch: str | None,
                  cache: ImageCache | None, done: Callable[[Job], None]) -> None:
    async with task_sandbox(spec, workdir_source=repo, scratch_dir=scratch, cache=cache) as sb:
        await episode.baseline(sb, spec, restorable=True)
        while True:
            try:
                job = jobs.get_nowait()
            except asyncio.QueueEmpty:
                return
            runs = [await _run_suite(sb, spec, job.diff, timeout_s) for _ in range(job.runs)]
            if job.again is not None and job.again(runs[0]):
                runs.append(await _run_suite(sb, spec, job.diff, timeout_s))
            write_atomic(job.path, (json.dumps({"runs": [r.to_json() for r in runs]}, sort_keys=True) + "\n")
                         .encode())
            done(job)


def run_jobs(repository: dict[str, bytes], spec: TaskSpec, todo: list[Job], *, workers: int, timeout_s: float,
             scratch: str | None = None, cache: ImageCache | None = None,
             done: Callable[[Job], None] = lambda job: None) -> None:
    """Every job's result file, `workers` sandboxes at a time (spec's image found in `cache`). Raises
    SandboxError when a sandbox cannot run (the infrastructure's failure, not a mutant's: nothing is
    refused for it)."""
    if not todo:
        return
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-mutate-", dir=scratch))
    try:
        repo = materialize(repository, tmp / "repo")

        async def main() -> None:
            queue: asyncio.Queue = asyncio.Queue()
            for job in todo:
                queue.put_nowait(job)
            await asyncio.gather(*(_worker(repo, spec, queue, timeout_s, scratch, cache, done)
                                   for _ in range(max(1, min(workers, len(todo))))))
        asyncio.run(main())
    except SandboxError as e:
        raise SandboxError(f"validation could not run the suite in a sandbox: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
