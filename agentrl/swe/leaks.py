"""`agentrl tasks check --leaks`: is the answer within the agent's reach before it starts?

A task hands the agent its own answer when the sandbox holds the fix somewhere: on a git ref or in a reflog
the history stripping kept (a task with `history = "keep"`), in HEAD's own history (a task made by
reverting a fix), an installed copy in site-packages, a pip, uv or conda cache, a *.orig or *.rej, a build
context left in the image. The fix is what the task's solution/solve.sh makes: the oracle runs it in one
sandbox and the post-fix bytes of each file it changes are taken; then a fresh sandbox, baselined as the
pool's are (history stripped), runs sandbox_scripts/find_leaks.py as the agent, which searches every git
object and the file system for them. Each place found is a row naming the task, the file, the place and
how it matched; a task with one fails the check, as a fooled grader does.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpc.sandbox.base import SandboxError

from . import episode
from .check import Where, each_task
from .loaded import LoadedTask, materialize
from .sandboxes import task_sandbox

FIND_SCRIPT = (Path(__file__).with_name("sandbox_scripts") / "find_leaks.py").read_text()
FIND_TIMEOUT_S = 900.0
# A line the fix adds counts as the fix's mark when it is at least this long once stripped: shorter ones
# ("return x", "pass", "}") are in half the files of any project.
MIN_LINE = 8


@dataclass(frozen=True)
class Leak:
    instance_id: str
    file: str        # the file of the task's repository whose fixed content was found
    place: str       # where: a path, an archive's member, a git repository's blob and what reaches it
    how: str         # "the fixed file" (byte for byte) or "every line the fix adds"


@dataclass(frozen=True)
class LeakCheck:
    instance_id: str
    leaks: list[Leak] = field(default_factory=list)
    problem: str = ""
    seconds: float = 0.0

    @property
    def flagged(self) -> bool:
        return bool(self.leaks or self.problem)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def fix_marks(changed: dict[str, tuple[bytes, bytes | None]]) -> list[dict]:
    """What find_leaks.py looks for, per file the solution changes: the fixed file's git blob id and the
    lines the fix adds (stripped, at least MIN_LINE long, absent from the file before). A deleted file
    leaves nothing to find."""
    marks = []
    for path, (before, after) in sorted(changed.items()):
        if after is None:
            continue
        old = {line.strip() for line in before.splitlines()}
        lines = sorted({line.strip().decode(errors="replace") for line in after.splitlines()
                        if len(line.strip()) >= MIN_LINE and line.strip() not in old})
        marks.append({"path": path, "blob": git_blob_id(after), "lines": lines})
    return marks


async def solution_changes(task: LoadedTask, repo: Path | None, where: Where) -> dict[str, tuple[bytes, bytes | None]]:
    """The files the task's solve.sh changes, before and after, from a sandbox of its own."""
    assert task.solution is not None
    async with task_sandbox(task.spec, runtime=where.runtime, cache=where.cache, workdir_source=repo,
                            scratch_dir=where.scratch) as sb:
        await episode.baseline(sb, task.spec)
        await sb.write_file("/solution/solve.sh", task.solution, mode=0o755)
        r = await episode.run_agent(sb, task.spec, ["bash", "/solution/solve.sh"])
        if r.exit_code != 0:
            raise SandboxError(f"solve.sh exited with {r.exit_code}: {r.stderr.decode(errors='replace')[-500:]}")
        return await episode.changed_files(sb, task.spec)


async def search(task: LoadedTask, repo: Path | None, marks: list[dict], where: Where) -> list[Leak]:
    """find_leaks.py as the agent, in a sandbox as the agent would find it."""
    spec = task.spec
    async with task_sandbox(spec, runtime=where.runtime, cache=where.cache, workdir_source=repo,
                            scratch_dir=where.scratch) as sb:
        await episode.baseline(sb, spec)
        request = json.dumps({"workdir": spec.workdir, "fixes": marks}).encode()
        r = await sb.exec(["python3", "-I", "-c", FIND_SCRIPT], user="agent", cwd="/", stdin=request,
                          timeout_s=FIND_TIMEOUT_S)
        if r.exit_code != 0 or r.timed_out:
            said = r.stderr.decode(errors="replace").strip()[-500:]
            why = "the image has no python3" if r.exit_code == 127 else said
            raise SandboxError(f"the search {'timed out' if r.timed_out else f'exited {r.exit_code}'}: {why}")
        found = json.loads(r.stdout)
    return [Leak(spec.instance_id, f["file"], f["place"], f["how"]) for f in found]


async def check_task(task: LoadedTask, where: Where | None = None) -> LeakCheck:
    where = where or Where()
    t0 = time.monotonic()
    iid = task.spec.instance_id
    if task.solution is None:
        return LeakCheck(iid, problem="no solution/solve.sh: nothing to look for")
    tmp = Path(tempfile.mkdtemp(prefix="leaks-", dir=where.scratch))
    try:
        def repo(name: str) -> Path | None:
            return materialize(task.testbed, tmp / name) if task.testbed else None
        marks = fix_marks(await solution_changes(task, repo("oracle"), where))
        if not marks:
            return LeakCheck(iid, problem="solve.sh changes no file: nothing to look for",
                             seconds=round(time.monotonic() - t0, 2))
        leaks = await search(task, repo("search"), marks, where)
        return LeakCheck(iid, leaks, seconds=round(time.monotonic() - t0, 2))
    except (SandboxError, ValueError) as e:
        return LeakCheck(iid, problem=f"the audit failed: {e}", seconds=round(time.monotonic() - t0, 2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def check_leaks(tasks: list[LoadedTask], concurrency: int = 2, where: Where | None = None,
                      progress=None) -> list[LeakCheck]:
    return await each_task(tasks, lambda t: check_task(t, where), concurrency, progress)


def render_table(rows: list[LeakCheck]) -> str:
    width = max([32, *(len(r.instance_id) for r in rows)])
    lines = [f"{'task':<{width}} {'file':<28} place (how)"]
    for r in rows:
        if r.problem:
            lines.append(f"{r.instance_id:<{width}} {'-':<28} {r.problem}")
        for leak in r.leaks:
            lines.append(f"{r.instance_id:<{width}} {leak.file:<28} {leak.place} ({leak.how})")
        if not r.flagged:
            lines.append(f"{r.instance_id:<{width}} {'-':<28} no leak found ({r.seconds:.1f} s)")
    bad = sum(r.flagged for r in rows)
    lines.append(f"{len(rows)} tasks searched for their solution, {bad} flagged"
                 + (": the agent can read the answer; strip it from the image, or drop the task" if bad else ""))
    return "\n".join(lines)
