"""One task in one sandbox: start state, the agent's run, its patch, and the grade.

The steps a rollout (and `agentrl tasks check`) takes, each a small async function
over a Sandbox, so that the pool, eval and checks share them:
    baseline  -> the repository's git history beyond HEAD stripped (agentrl.swe.history), then the work
                 tree remembered as the agent finds it (a git tree outside it)
    run_agent -> the agent's command as the non-root agent user, stopped at its time limit
    patch     -> every process the agent left is killed, then what it changed (binary-safe,
                 scratch files excluded)
    restore   -> same-sandbox grading only: the work tree back to the baseline (its .git too),
                 the patch applied: the work tree holds the patch and nothing else
    grade     -> the verifier's files enter now (not before), eval as root, Harbor's reward
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpc.sandbox.base import AGENT_GID, AGENT_UID, ExecResult, Sandbox, SandboxError

from . import history
from .loaded import LoadedTask
from .task import RewardError, TaskSpec, reward_from

# Root's own git dir, outside the work tree: the agent can neither see nor rewrite the baseline.
BASELINE_GIT = "/var/lib/agentrl/baseline.git"
SAVED_DOTGIT = "/var/lib/agentrl/dotgit"    # the repository's own .git as the agent found it
# A throwaway index: staging the agent's work must not touch the baseline's own index.
PATCH_INDEX = "/var/lib/agentrl/patch.index"
TESTS_DIR = "/tests"
LOGS_DIR = "/logs/verifier"
# What the grader's root makes in an image it does not own (hpc.sandbox.base.SandboxSpec.root_dirs).
GRADER_DIRS = (str(Path(BASELINE_GIT).parent), TESTS_DIR, LOGS_DIR)
_GIT = ["git", f"--git-dir={BASELINE_GIT}", "-c", "user.name=agentrl", "-c", "user.email=agentrl@localhost",
        "-c", "core.fileMode=true", "-c", "safe.directory=*"]


# Never part of a patch. Python runs an unchecked-hash pyc (PEP 552) without looking at its source,
# and a timestamp pyc whenever the source's recorded mtime and size still match: bytecode the agent
# leaves is code the grader runs but the patch's sources do not show (a neutered copy of a test file
# the verifier later restores, a module that makes unittest report success). Left out here, it never
# reaches isolated grading; same-sandbox grading's restore removes what the agent added and checks out
# what it changed, tracked pycs included. `__pycache__` on its own also catches a symlink so named.
# Bytecode a task ships stays as the task has it.
BYTECODE = ("**/__pycache__", "**/__pycache__/**", "**/*.py[co]")


@dataclass(frozen=True)
class Grade:
    reward: float
    exit_code: int
    output: bytes
    duration_s: float
    timed_out: bool
    limits: tuple[str, ...] = ()     # the grading sandbox's limits its run (the patch's code) ran into


async def limits_hit(sb: Sandbox) -> tuple[str, ...]:
    """The limits the sandbox's processes ran into so far (hpc.sandbox.usage; () where not measured)."""
    usage = await sb.usage()
    return usage.limits_hit() if usage is not None else ()


async def unusable(sb: Sandbox) -> str | None:
    """Why grading could not run in `sb` now (dead, its disk or /tmp full, its memory held), or None."""
    usage = await sb.usage()
    if usage is None:
        return None
    if not usage.alive:
        return "it is gone"
    at = usage.exhausted()
    return f"it is at its {', '.join(at)} limit" if at else None


async def limits_or_raise(sb: Sandbox, error: SandboxError) -> tuple[str, ...]:
    """The limits `sb` ran into, which make `error` the doing of what ran in it (the agent, its patch's
    code); with none, `error` is the infrastructure's and is raised again."""
    hit = await limits_hit(sb)
    if not hit:
        raise error
    return hit


async def _limited(sb: Sandbox, error: SandboxError, t0: float) -> Grade:
    """The grade of a grading that failed at its sandbox's limit: 0 (else SandboxError, raised again)."""
    hit = await limits_or_raise(sb, error)
    note = f"\n[agentrl] grading ran into the sandbox's {', '.join(hit)} limit: {error}".encode()
    return Grade(0.0, -1, note, time.monotonic() - t0, False, limits=hit)


def _git(workdir: str, *args: str) -> list[str]:
    return [*_GIT, f"--work-tree={workdir}", *args]


async def _check(sb: Sandbox, argv: Sequence[str] | str, what: str, **kw) -> ExecResult:
    r = await sb.exec(argv, **kw)
    if r.exit_code != 0:
        raise SandboxError(f"{what} failed ({r.exit_code}): {r.stderr.decode(errors='replace').strip()[:2000]}")
    return r


async def baseline(sb: Sandbox, spec: TaskSpec, *, restorable: bool = False) -> None:
    """Record the work tree as the agent will find it (reset to base_commit only if the task asks), its
    repository's history first stripped to what the task's `history` keeps.

    `restorable`: also keep a copy of the repository's .git (which no patch carries), for
    `restore` before same-sandbox grading.
    """
    w = spec.workdir
    if spec.reset_to_base_commit and spec.base_commit:
        await _check(sb, ["git", "-C", w, "-c", "safe.directory=*", "checkout", "-q", "-f", spec.base_commit],
                     "reset to base_commit", user="root", cwd=w)
    # Before anything is recorded or saved: same-sandbox grading restores the stripped .git, and isolated
    # grading's fresh sandbox strips its own, so the patch's code meets no answer at grading time either.
    await history.strip(sb, w, spec.history)
    await _check(sb, ["mkdir", "-p", str(Path(BASELINE_GIT).parent)], "baseline dir", user="root", cwd="/")
    await _check(sb, ["chmod", "700", str(Path(BASELINE_GIT).parent)], "baseline dir", user="root", cwd="/")
    await _check(sb, [*_git(w, "init", "-q")], "git init", user="root", cwd=w)
    await _check(sb, [*_git(w, "add", "-A", "-f", ".")], "git add", user="root", cwd=w)
    await _check(sb, [*_git(w, "commit", "-q", "--allow-empty", "--no-verify", "-m", "start")],
                 "git commit", user="root", cwd=w)
    if restorable:
        await _check(sb, ["sh", "-c", '[ ! -d "$0/.git" ] || cp -a "$0/.git" "$1"', w, SAVED_DOTGIT],
                     "save .git", user="root", cwd="/")
    # An image's work tree belongs to its root; the agent is not root. On an overlay this
    # copies metadata only. (The local runtime's "root" is the current user: nothing to hand over.)
    owner = f"{AGENT_UID}:{AGENT_GID}"
    await _check(sb, ["sh", "-c", f'[ "$(id -u)" != 0 ] || [ "$(stat -c %u:%g "$0")" = {owner} ] '
                                  f'|| chown -R {owner} "$0"', w],
                 "hand the work tree to the agent", user="root", cwd="/")


async def run_agent(sb: Sandbox, spec: TaskSpec, command: Sequence[str] | str,
                    env: Mapping[str, str] | None = None) -> ExecResult:
    """The agent's command as the agent user; at its time limit its process group is stopped."""
    return await sb.exec(command, user="agent", cwd=spec.workdir, env=env, timeout_s=spec.timeouts.agent_s)


async def patch(sb: Sandbox, spec: TaskSpec) -> bytes:
    """The agent's change against the baseline: `git diff --binary`, untracked files included,
    bytecode (`BYTECODE`) and the task's `files_to_exclude_from_patch` left out.

    First every process of the sandbox but its init is killed: a daemon the agent left behind
    (setsid, nohup, a double fork) would otherwise go on editing files while they are graded.
    """
    r = await _staged_diff(sb, spec, "--binary")
    return r.stdout


async def _staged_diff(sb: Sandbox, spec: TaskSpec, *diff_args: str) -> ExecResult:
    """`git diff --cached HEAD` of everything the work tree changed since the baseline (the patch's
    exclusions left out), every process but init killed first."""
    await sb.kill_processes()
    w = spec.workdir
    excludes = [f":(exclude,glob){p}" for p in (*spec.files_to_exclude_from_patch, *BYTECODE)]
    env = {"GIT_INDEX_FILE": PATCH_INDEX}
    await _check(sb, [*_git(w, "read-tree", "HEAD")], "git read-tree", user="root", cwd=w, env=env)
    await _check(sb, [*_git(w, "add", "-A", "-f", "--", ".", *excludes)], "git add", user="root", cwd=w, env=env)
    return await _check(sb, [*_git(w, "diff", "--cached", *diff_args, "HEAD", "--", ".", *excludes)],
                        "git diff", user="root", cwd=w, env=env)


async def changed_files(sb: Sandbox, spec: TaskSpec) -> dict[str, tuple[bytes, bytes | None]]:
    """Each file the work tree changed since the baseline: its baseline bytes (b"" for a new file) and its
    bytes now (None: deleted). What the oracle's solve.sh makes is the fix `agentrl tasks check --leaks`
    looks for."""
    names = (await _staged_diff(sb, spec, "--name-status", "-z", "--no-renames")).stdout.split(b"\0")
    out: dict[str, tuple[bytes, bytes | None]] = {}
    w = spec.workdir
    for status, raw in zip(names[::2], names[1::2], strict=False):
        path = raw.decode(errors="surrogateescape")
        before = b"" if status == b"A" else (await _check(sb, [*_git(w, "show", f"HEAD:{path}")], "git show",
                                                          user="root", cwd=w)).stdout
        after = None if status == b"D" else (await _check(sb, [*_git(w, "show", f":{path}")], "git show",
                                                          user="root", cwd=w,
                                                          env={"GIT_INDEX_FILE": PATCH_INDEX})).stdout
        out[path] = (before, after)
    return out


async def restore(sb: Sandbox, spec: TaskSpec, diff: bytes) -> None:
    """Same-sandbox grading: nothing of the agent's but its patch reaches the grader.

    The work tree goes back to the baseline (tracked files checked out, everything else removed),
    its .git comes back from the copy `baseline(restorable=True)` kept (hooks, config and
    fsmonitor the agent set would otherwise run as root when a test.sh runs git), and the patch is
    applied. What the agent left outside the work tree (/tmp, its HOME) stays: isolated grading
    is the mode where nothing of the agent's sandbox is trusted.
    """
    w = spec.workdir
    await sb.kill_processes()
    await _check(sb, [*_git(w, "checkout", "-q", "-f", "HEAD", "--", ".")], "git checkout", user="root", cwd="/")
    await _check(sb, [*_git(w, "clean", "-q", "-ffdx")], "git clean", user="root", cwd="/")
    await _check(sb, ["sh", "-c", 'rm -rf "$0/.git" && { [ ! -d "$1" ] || cp -a "$1" "$0/.git"; }', w, SAVED_DOTGIT],
                 "restore .git", user="root", cwd="/")
    await apply_patch(sb, spec, diff)


async def install_tests(sb: Sandbox, tests: Mapping[str, bytes]) -> None:
    """The verifier's files, written at grading time only (as data on stdin, never argv)."""
    for rel, data in sorted(tests.items()):
        mode = 0o755 if rel.endswith(".sh") else 0o644
        await sb.write_file(f"{TESTS_DIR}/{rel}", data, mode=mode)


async def grade(sb: Sandbox, spec: TaskSpec, tests: Mapping[str, bytes],
                env: Mapping[str, str] | None = None) -> Grade:
    """Run the task's eval command as root after the agent has stopped; reward by Harbor's rules."""
    t0 = time.monotonic()
    await install_tests(sb, tests)
    await _check(sb, ["mkdir", "-p", LOGS_DIR], "logs dir", user="root", cwd="/")
    r = await sb.exec(spec.eval_command, user="root", cwd=spec.workdir, env=env, timeout_s=spec.timeouts.eval_s)
    # Whatever the code under test started does not get to write the reward after the verifier.
    await sb.kill_processes()
    if r.timed_out:
        return Grade(0.0, r.exit_code, r.stdout + r.stderr, time.monotonic() - t0, True)
    if r.exit_code < 0:
        # Killed by a signal (the code under test can kill its verifier after writing reward.txt):
        # no reward file it left is the verifier's verdict.
        return Grade(0.0, r.exit_code, r.stdout + r.stderr + b"\n[agentrl] the verifier was killed by a signal",
                     time.monotonic() - t0, False)
    files: dict[str, str | None] = {}
    for name in ("reward.txt", "reward.json"):
        try:
            files[name] = (await sb.read_file(f"{LOGS_DIR}/{name}")).decode()
        except FileNotFoundError:
            files[name] = None
    try:
        reward = reward_from(r.exit_code, files["reward.txt"], files["reward.json"])
    except RewardError as e:
        raise SandboxError(f"{spec.instance_id}: the verifier wrote an unreadable reward: {e}") from None
    return Grade(reward, r.exit_code, r.stdout + r.stderr, time.monotonic() - t0, False)


async def apply_patch(sb: Sandbox, spec: TaskSpec, diff: bytes) -> None:
    """Isolated grading: the agent's patch applied to a fresh copy of the task."""
    if diff:
        await sb.write_file("/var/lib/agentrl/agent.patch", diff)
        await _check(sb, ["git", "-c", "safe.directory=*", "apply", "--binary", "--whitespace=nowarn",
                          "/var/lib/agentrl/agent.patch"], "git apply", user="root", cwd=spec.workdir)


GRADINGS = ("same", "isolated")


async def grade_attempt(task: LoadedTask, spec: TaskSpec, sb: Sandbox, diff: bytes, grading: str,
                        fresh: Callable[[], Sandbox]) -> Grade:
    """An attempt's grade, the way the pool grades it: "same" runs the verifier in the agent's sandbox
    `sb`, first restored to the baseline and the patch (`baseline(restorable=True)`); "isolated"
    applies the agent's patch `diff` to `fresh()` (an unstarted sandbox of the task)
    and grades there, so nothing the agent left in its sandbox (a root-capable agent could have
    tampered with the grader) is trusted. "same" falls back to "isolated" where the agent left its
    sandbox unusable (`unusable`). A grading that fails because its sandbox ran into a limit (the
    patch's code filled the disk, say) grades 0; any other failure raises SandboxError."""
    if grading not in GRADINGS:
        raise ValueError(f"grading must be one of {', '.join(GRADINGS)}, got {grading!r}")
    t0 = time.monotonic()
    if grading == "same" and await unusable(sb) is None:
        try:
            await restore(sb, spec, diff)
            return await grade(sb, spec, task.tests, env=task.verifier_env)
        except SandboxError as e:
            return await _limited(sb, e, t0)
    async with fresh() as clean:
        await baseline(clean, spec)
        try:
            await apply_patch(clean, spec, diff)
            return await grade(clean, spec, task.tests, env=task.verifier_env)
        except SandboxError as e:
            return await _limited(clean, e, t0)
