"""Each task's solution must pass and its untouched repository must fail (`agentrl tasks check`).

Like Harbor's oracle and no-op agents, run in real sandboxes: a converted data set is
checked this way before GPU hours are spent on it. With --hacks, known reward hacks
(agentrl/swe/hacks.py) run too, graded the way the pool grades (`episode.grade_attempt`): each
must earn reward 0. With --leaks, each task's sandbox is searched for its solution (agentrl/swe/leaks.py):
it must hold it nowhere.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hpc.images.cache import ImageCache
from hpc.sandbox.base import SandboxError
from hpc.sandbox.factory import Runtime

from . import episode
from .loaded import LoadedTask, materialize
from .sandboxes import task_sandbox

R = TypeVar("R")


@dataclass(frozen=True)
class CheckRow:
    instance_id: str
    oracle_reward: float | None
    noop_reward: float | None
    oracle_s: float
    noop_s: float
    problem: str = ""

    @property
    def flagged(self) -> bool:
        return bool(self.problem)


@dataclass(frozen=True)
class Where:
    """Where the attempts run: the sandbox runtime, the image cache, node-local scratch disk."""
    runtime: Runtime = "bwrap"
    cache: ImageCache | None = None
    scratch: str | None = None


async def _attempt(task: LoadedTask, repo: Path | None, solution: bytes | None, where: Where) -> float:
    """The reward of one attempt: the oracle's, running `solution` (solve.sh), or with None the no-op's."""
    spec = task.spec
    async with task_sandbox(spec, runtime=where.runtime, cache=where.cache, workdir_source=repo,
                            scratch_dir=where.scratch) as sb:
        await episode.baseline(sb, spec)
        if solution is not None:
            await sb.write_file("/solution/solve.sh", solution, mode=0o755)
            r = await episode.run_agent(sb, spec, ["bash", "/solution/solve.sh"])
            if r.exit_code != 0:
                raise SandboxError(f"solve.sh exited with {r.exit_code}: {r.stderr.decode(errors='replace')[-500:]}")
        return (await episode.grade(sb, spec, task.tests, env=task.verifier_env)).reward


async def check_task(task: LoadedTask, where: Where = Where()) -> CheckRow:
    tmp = Path(tempfile.mkdtemp(prefix="task-", dir=where.scratch))
    try:
        repo = materialize(task.testbed, tmp / "repo") if task.testbed else None
        results: dict[str, float | None] = {}
        times: dict[str, float] = {}
        problems: list[str] = []
        for mode in ("oracle", "noop"):
            t0 = time.monotonic()
            if mode == "oracle" and task.solution is None:
                results[mode], times[mode] = None, 0.0
                problems.append("no solution/solve.sh")
                continue
            try:
                results[mode] = await _attempt(task, repo, task.solution if mode == "oracle" else None, where)
            except SandboxError as e:
                results[mode] = None
                problems.append(f"{mode}: {e}")
            times[mode] = time.monotonic() - t0
        if (oracle := results.get("oracle")) is not None and oracle < 1.0:
            problems.append(f"oracle reward {oracle:g}: the solution does not pass")
        if (noop := results.get("noop")) is not None and noop > 0.0:
            problems.append(f"no-op reward {noop:g}: the untouched repository already passes")
        return CheckRow(task.spec.instance_id, results.get("oracle"), results.get("noop"),
                        round(times.get("oracle", 0.0), 2), round(times.get("noop", 0.0), 2), "; ".join(problems))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def each_task(tasks: list[LoadedTask], check: Callable[[LoadedTask], Awaitable[R]], concurrency: int,
                    progress: Callable[[R], None] | None = None) -> list[R]:
    """`check` of every task, `concurrency` at once, in the tasks' order; `progress` of each as it ends."""
    sem = asyncio.Semaphore(concurrency)

    async def one(t: LoadedTask) -> R:
        async with sem:
            row = await check(t)
        if progress:
            progress(row)
        return row
    return list(await asyncio.gather(*(one(t) for t in tasks)))


async def check_tasks(tasks: list[LoadedTask], concurrency: int = 2, where: Where = Where(),
                      progress=None) -> list[CheckRow]:
    return await each_task(tasks, lambda t: check_task(t, where), concurrency, progress)


def render_table(rows: list[CheckRow]) -> str:
    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:g}"
    lines = [f"{'task':<32} {'oracle':>6} {'no-op':>6} {'oracle s':>9} {'no-op s':>8}  problem"]
    for r in rows:
        lines.append(f"{r.instance_id:<32} {fmt(r.oracle_reward):>6} {fmt(r.noop_reward):>6} "
                     f"{r.oracle_s:>9.2f} {r.noop_s:>8.2f}  {r.problem}")
    bad = sum(r.flagged for r in rows)
    lines.append(f"{len(rows)} tasks, {bad} flagged")
    return "\n".join(lines)
