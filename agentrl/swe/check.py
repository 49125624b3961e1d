"""`agentrl tasks check`: each task's solution must pass and its untouched repository must fail.

Like Harbor's oracle and no-op agents, run in real sandboxes: a converted data set is
checked this way before GPU hours are spent on it. With --hacks, known reward hacks
(agentrl/swe/hacks.py) run too, graded the way the pool grades (`grade_attempt`): each
must earn reward 0.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpc.images.cache import ImageCache
from hpc.sandbox.base import Sandbox, SandboxError
from hpc.sandbox.factory import Runtime

from . import episode
from .sandboxes import task_sandbox
from .task import TaskSpec, decode_payload

_SPEC_KEYS = ("instance_id", "image", "workdir", "eval_command", "timeouts", "resources", "base_commit",
              "reset_to_base_commit", "files_to_exclude_from_patch")


@dataclass(frozen=True)
class LoadedTask:
    spec: TaskSpec
    tests: dict[str, bytes]
    solution: bytes | None
    testbed: dict[str, bytes] | None
    verifier_env: dict[str, str]


def decode_payloads(given: Any, where: str) -> dict[str, bytes]:
    """A record's payload files (path -> gzip + base64), each path checked and no file past MAX_FILE_BYTES."""
    from .task import MAX_FILE_BYTES, TaskSpecError, check_payload_path

    given = given or {}
    if not isinstance(given, dict):
        raise TaskSpecError(f"{where}: must be an object of path -> payload, got {type(given).__name__}")
    out = {}
    for rel, text in given.items():
        check_payload_path(rel, where)
        try:
            out[rel] = decode_payload(text, max_bytes=MAX_FILE_BYTES)
        except (ValueError, TypeError, EOFError) as e:
            raise TaskSpecError(f"{where}: {rel!r}: the payload {e} (a payload is gzip + base64 of at most "
                                f"{MAX_FILE_BYTES} bytes): convert the task again (`agentrl convert harbor`)") from None
    return out


def load_record(record: dict[str, Any]) -> LoadedTask:
    """A task from one record of the prompt data (what `agentrl convert harbor` writes).

    The record is untrusted: payload keys are written under a directory (the
    repository on the host, /tests in the sandbox), so each must be a relative
    path that stays there, and no payload may inflate past MAX_FILE_BYTES.
    """
    from .task import load_task_spec

    meta = record["metadata"]
    harbor = meta["harbor"]
    where = f"task {meta.get('instance_id')!r}: metadata.harbor"
    spec = load_task_spec({"prompt": record["prompt"], **{k: meta[k] for k in _SPEC_KEYS if k in meta}},
                          source=f"task {meta.get('instance_id')!r}")

    tests = {"test.sh": harbor["test_sh"].encode()}
    if harbor.get("config_json") is not None:
        tests["config.json"] = harbor["config_json"].encode()
    tests.update(decode_payloads(harbor.get("test_files"), f"{where}.test_files"))
    testbed = decode_payloads(harbor.get("testbed_files"), f"{where}.testbed_files") or None
    solve = harbor.get("solve_sh")
    return LoadedTask(spec, tests, solve.encode() if solve is not None else None, testbed,
                      dict(harbor.get("verifier_env") or {}))


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


def materialize(files: dict[str, bytes], into: Path, executable: Collection[str] | None = None,
                what: str = "testbed_files") -> Path:
    """Payload files (a host task's repository, an environment's build context) under `into`.

    Only under `into`: a key that is absolute, has '..' or is empty is refused
    (TaskSpecError), and so is one that resolves outside `into` through a
    symlink already there; the last component is never followed (O_NOFOLLOW).
    The files in `executable` (default: the *.sh ones) get mode 0755, the others 0644.
    """
    import os

    from .task import TaskSpecError, check_payload_path

    into = Path(into)
    for rel in files:
        check_payload_path(rel, f"{what} (materialized under {into})")
    into.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(into)
    for rel, data in files.items():
        path = into / rel
        parent = os.path.realpath(path.parent)  # checked before mkdir, which would follow a symlink out
        if os.path.commonpath([parent, root]) != root:
            raise TaskSpecError(f"{what}: key {rel!r} resolves to {parent}, outside {into} (through a "
                                f"symlink there): materialize into an empty directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.islink(path):
            raise TaskSpecError(f"{what}: key {rel!r}: {path} is a symlink, which would be written through: "
                                "materialize into an empty directory")
        mode = 0o755 if (rel in executable if executable is not None else rel.endswith(".sh")) else 0o644
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)     # the umask narrowed it
    return into


@dataclass(frozen=True)
class Where:
    """Where the attempts run: the sandbox runtime, the image cache, node-local scratch disk."""
    runtime: Runtime = "bwrap"
    cache: ImageCache | None = None
    scratch: str | None = None


GRADINGS = ("same", "isolated")


async def grade_attempt(task: LoadedTask, spec: TaskSpec, sb: Sandbox, diff: bytes, grading: str,
                        fresh: Callable[[], Sandbox]) -> episode.Grade:
    """An attempt's grade, the way the pool grades it: "same" runs the verifier in the agent's sandbox
    `sb`, first restored to the baseline and the patch (`baseline(restorable=True)`); "isolated"
    applies the agent's patch `diff` to `fresh()` (an unstarted sandbox of the task)
    and grades there, so nothing the agent left in its sandbox (a root-capable agent could have
    tampered with the grader) is trusted."""
    if grading == "same":
        await episode.restore(sb, spec, diff)
        return await episode.grade(sb, spec, task.tests, env=task.verifier_env)
    if grading != "isolated":
        raise ValueError(f"grading must be one of {', '.join(GRADINGS)}, got {grading!r}")
    async with fresh() as clean:
        await episode.baseline(clean, spec)
        await episode.apply_patch(clean, spec, diff)
        return await episode.grade(clean, spec, task.tests, env=task.verifier_env)


async def _attempt(task: LoadedTask, repo: Path | None, oracle: bool, where: Where) -> float:
    spec = task.spec
    async with task_sandbox(spec, runtime=where.runtime, cache=where.cache, workdir_source=repo,
                            scratch_dir=where.scratch) as sb:
        await episode.baseline(sb, spec)
        if oracle:
            await sb.write_file("/solution/solve.sh", task.solution, mode=0o755)
            r = await episode.run_agent(sb, spec, ["bash", "/solution/solve.sh"])
            if r.exit_code != 0:
                raise SandboxError(f"solve.sh exited with {r.exit_code}: {r.stderr.decode(errors='replace')[-500:]}")
        return (await episode.grade(sb, spec, task.tests, env=task.verifier_env)).reward


async def check_task(task: LoadedTask, where: Where = Where()) -> CheckRow:
    tmp = Path(tempfile.mkdtemp(prefix="task-", dir=where.scratch))
    try:
        repo = materialize(task.testbed, tmp / "repo") if task.testbed else None
        results, times, problems = {}, {}, []
        for mode in ("oracle", "noop"):
            t0 = time.monotonic()
            if mode == "oracle" and task.solution is None:
                results[mode], times[mode] = None, 0.0
                problems.append("no solution/solve.sh")
                continue
            try:
                results[mode] = await _attempt(task, repo, mode == "oracle", where)
            except SandboxError as e:
                results[mode] = None
                problems.append(f"{mode}: {e}")
            times[mode] = time.monotonic() - t0
        if results.get("oracle") is not None and results["oracle"] < 1.0:
            problems.append(f"oracle reward {results['oracle']:g}: the solution does not pass")
        if results.get("noop") is not None and results["noop"] > 0.0:
            problems.append(f"no-op reward {results['noop']:g}: the untouched repository already passes")
        return CheckRow(task.spec.instance_id, results.get("oracle"), results.get("noop"),
                        round(times.get("oracle", 0.0), 2), round(times.get("noop", 0.0), 2), "; ".join(problems))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def check_tasks(tasks: list[LoadedTask], concurrency: int = 2, where: Where = Where(),
                      progress=None) -> list[CheckRow]:
    sem = asyncio.Semaphore(concurrency)

    async def one(t: LoadedTask) -> CheckRow:
        async with sem:
            row = await check_task(t, where)
        if progress:
            progress(row)
        return row
    return list(await asyncio.gather(*(one(t) for t in tasks)))


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


def rows_json(rows: list[CheckRow], hack_rows: list | None = None) -> str:
    """One JSON object: the tasks' rows, with --hacks the hack runs' rows; `flagged` counts both."""
    out: dict[str, Any] = {"tasks": [asdict(r) for r in rows]}
    if hack_rows is not None:
        out["hacks"] = [asdict(r) for r in hack_rows]
    out["flagged"] = sum(r.flagged for r in rows) + sum(r.flagged for r in hack_rows or [])
    return json.dumps(out)


def load_task_records(paths: list[str] | list[Path]) -> list[dict[str, Any]]:
    """The prompt-data records of Harbor task directories (or directories of them) and JSONL prompt files."""
    from .harbor import convert_task, expand_task_dirs

    records, dirs = [], []
    for p in map(Path, paths):
        if p.suffix == ".jsonl":
            records += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        else:
            dirs.append(p)
    return records + [convert_task(d) for d in expand_task_dirs(dirs)]


def load_tasks(paths: list[str]) -> list[LoadedTask]:
    """Harbor task directories (or directories of them) and JSONL prompt files."""
    return [load_record(r) for r in load_task_records(paths)]


def main(args) -> int:
    """`agentrl tasks check`; exit 1 when a task is flagged or a hack earns a reward."""
    import sys

    from . import hacks as hack_set
    from .harbor import HarborTaskError

    names = getattr(args, "hack", None) or []
    run_hacks = bool(getattr(args, "hacks", False) or getattr(args, "hacks_only", False) or names)
    try:
        chosen = hack_set.select(names) if run_hacks else []
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    try:
        tasks = load_tasks(args.paths)
    except (HarborTaskError, ValueError, KeyError, FileNotFoundError) as e:
        print(f"cannot load the tasks: {e}", file=sys.stderr)
        return 2
    if not tasks:
        print("no tasks found in " + " ".join(args.paths), file=sys.stderr)
        return 2

    def progress(row: CheckRow) -> None:
        if not args.json:
            print(f"  {row.instance_id}: oracle {row.oracle_reward}, no-op {row.noop_reward}"
                  f"{'  <- ' + row.problem if row.problem else ''}", file=sys.stderr, flush=True)

    def hack_progress(row) -> None:
        if not args.json:
            print(f"  {row.instance_id}: {row.hack} [{row.grading}] reward {row.reward}"
                  f"{'  <- ' + row.problem if row.problem else ''}", file=sys.stderr, flush=True)
    where = Where(args.runtime, ImageCache(args.image_cache) if args.image_cache else None, args.scratch)
    rows = [] if getattr(args, "hacks_only", False) else asyncio.run(check_tasks(tasks, args.concurrency, where,
                                                                                 progress))
    hack_rows = asyncio.run(hack_set.check_hacks(tasks, chosen, getattr(args, "grading", "both"), args.concurrency,
                                                 where, hack_progress)) if run_hacks else None
    if rows:
        print(render_table(rows))
    if hack_rows is not None:
        print(hack_set.render_table(hack_rows))
    if args.json:
        print(rows_json(rows, hack_rows))
    return 1 if any(r.flagged for r in rows) or any(r.flagged for r in hack_rows or []) else 0
