"""One attempt: a task's sandbox, the harness's agent talking to the adapter, the patch, the grade, samples.

Failures split in two. An infrastructure failure (the sandbox did not boot, the model server was
down, the grader crashed) raises `InfraError`: the pool fails the claim and the ledger retries the
attempt within its bound; it is never trained as reward 0. An agent failure (an empty patch, failing
tests, a crashed agent) is a real outcome: its samples carry the real reward. So is a sandbox the
agent broke: a command or the sandbox itself failing at one of its limits (memory, pids, its disk,
/tmp; hpc.sandbox.usage reads the kernel's counters) ends the attempt with reward 0, the limits
named in its metadata (`limits`, beside "time" for an agent stopped at its time limit).

Timing: `on_span(name, start, end)` (time.monotonic seconds), if given, hears each of ATTEMPT_SPANS
as it ends (of an attempt that raises, those before). boot, agent and grade start before their bound
is taken, as the timings in the samples' metadata do (`AttemptMetadata.boot_s` is boot's length); *_queue is the wait
at that bound alone; teardown is the sandboxes stopping after grading.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc.images.cache import ImageCache
from hpc.sandbox.base import ExecResult, SandboxError
from hpc.sandbox.cgroups import unenforced_message
from hpc.sandbox.storage import fallback_message

from ..adapter.service import Adapter
from ..adapter.trajectory import TurnSpan
from ..harness import get_harness
from ..harness.base import HarnessRun, Trajectory
from ..harness.empty_patch import classify_empty_patch, decide
from ..harness.prompts import PROBLEM_FILE
from ..sample import AttemptMetadata, Sample
from ..swe import episode
from ..swe.episode import grade_attempt
from ..swe.loaded import LoadedTask, materialize
from ..swe.sandboxes import task_sandbox
from .config import PoolConfig

log = logging.getLogger("agentrl.pool")
TOOLS_IN_SANDBOX = "/opt/agentrl/tools"
ADAPTER_PORT = 8000
ATTEMPT_SPANS = ("boot_queue", "boot", "agent_queue", "agent", "grade_queue", "grade", "teardown")

SpanSink = Callable[[str, float, float], None]     # (name, start, end), time.monotonic seconds


def no_span(name: str, start: float, end: float) -> None:
    """The SpanSink of an untimed attempt."""


class InfraError(Exception):
    """Not the agent's doing: the attempt is retried, never trained."""


@dataclass
class PoolContext:
    """What every attempt of one pool worker shares."""
    cfg: PoolConfig
    adapter: Adapter
    adapter_socket: str
    tools_dir: Path
    boot: asyncio.Semaphore
    agents: asyncio.Semaphore
    cache: ImageCache | None = None
    limits_reported: bool = False     # the node's unenforceable limits are said once, at the first sandbox


@dataclass
class AttemptOutcome:
    samples: list[Sample]
    reward: float
    metadata: AttemptMetadata
    timings: dict[str, float] = field(default_factory=dict)     # the phases' lengths, unrounded
    # For its trace (agentrl.pool.trace), not for training: the patch, the grade, the agent's process
    # and what the harness read from it, and each sample's turns (TurnSpan), in the samples' order.
    patch: bytes = b""
    grade: episode.Grade | None = None
    agent: ExecResult | None = None
    trajectory: Trajectory | None = None
    spans: list[tuple[TurnSpan, ...]] = field(default_factory=list)


async def run_attempt(ctx: PoolContext, task: LoadedTask, *, group: int, attempt: int,
                      sampling: Mapping[str, Any], on_span: SpanSink = no_span) -> AttemptOutcome:
    """One attempt, its model sampled with `sampling` (the rollout's temperature, a per-attempt seed)."""
    cfg, spec = ctx.cfg, task.spec
    harness = get_harness(cfg.harness)
    if spec.timeouts and cfg.agent_timeout_s:
        spec = spec.model_copy(update={"timeouts": spec.timeouts.model_copy(update={"agent_s": cfg.agent_timeout_s})})
    # The problem statement file is ours, not the agent's work: never part of the patch.
    spec = spec.model_copy(update={"files_to_exclude_from_patch": [*spec.files_to_exclude_from_patch, PROBLEM_FILE]})
    timings: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(prefix="attempt-", dir=cfg.scratch_dir))
    key = None
    try:
        async with AsyncExitStack() as stack:
            t0 = time.monotonic()
            async with ctx.boot:
                on_span("boot_queue", t0, time.monotonic())
                repo = materialize(task.testbed, work / "repo") if task.testbed else None
                try:
                    sb = task_sandbox(spec, runtime=cfg.runtime, cache=ctx.cache, workdir_source=repo,
                                      scratch_dir=str(cfg.scratch_dir) if cfg.scratch_dir else None,
                                      adapter_socket=ctx.adapter_socket,
                                      ro_binds={str(ctx.tools_dir): TOOLS_IN_SANDBOX},
                                      allow_unsafe_local=cfg.allow_unsafe_local, storage=cfg.sandbox_storage)
                    await stack.enter_async_context(sb)
                    _report_limits(ctx, sb)
                    await episode.baseline(sb, spec, restorable=cfg.grading == "same")
                except SandboxError as e:
                    raise InfraError(f"sandbox: {e}") from None
            timings["boot_s"] = _span(on_span, "boot", t0)

            session = ctx.adapter.sessions.open(sampling=dict(sampling),
                                                metadata={"group": group, "attempt": attempt, "task": spec.instance_id})
            key = session.key
            command = harness.command(HarnessRun(
                task_text=spec.prompt, prompt_style=cfg.prompt_style, workdir=spec.workdir,
                base_url=f"http://127.0.0.1:{ADAPTER_PORT}", api_key=key, model=cfg.adapter.model_name,
                max_new_tokens=int(sampling["max_new_tokens"]), max_context=cfg.adapter.max_context,
                compact_at=cfg.compact_at, tools_dir=TOOLS_IN_SANDBOX, extra_args=tuple(cfg.extra_args),
                extra_env=dict(cfg.extra_env)))
            t1 = time.monotonic()
            async with ctx.agents:
                on_span("agent_queue", t1, time.monotonic())
                for path, data in command.files.items():
                    await sb.write_file(path, data, user="agent")
                try:
                    run = await episode.run_agent(sb, spec, command.argv, env=command.env)
                except SandboxError as e:
                    run = await _broken_by_agent(sb, e, "the agent's turn", t1)
            timings["agent_s"] = _span(on_span, "agent", t1)
            trajectory = harness.read_trajectory(run.stdout, run.stderr)
            limits = await episode.limits_hit(sb) + (("time",) if run.timed_out else ())

            t2 = time.monotonic()
            async with ctx.boot:
                on_span("grade_queue", t2, time.monotonic())
                diff: bytes | None
                try:
                    diff = await episode.patch(sb, spec)
                except SandboxError as e:       # what the agent left cannot be read: it broke its own sandbox
                    broken = await _broken_by_agent(sb, e, "taking the patch", t2)
                    diff, grade = None, episode.Grade(0.0, -1, broken.stderr, time.monotonic() - t2, False)
                else:
                    try:
                        grade = await _grade(ctx, task, spec, sb, diff, work)
                    except SandboxError as e:
                        raise InfraError(f"grading: {e}") from None
            timings["grade_s"] = _span(on_span, "grade", t2)
            # same-sandbox grading ran the patch's code in the agent's sandbox: what it hit counts too
            after = await episode.limits_hit(sb) if cfg.grading == "same" else ()
            limits = tuple(dict.fromkeys((*limits, *after, *grade.limits)))
            t3 = time.monotonic()
        _span(on_span, "teardown", t3)     # the stack's exit: the agent's sandbox stopped

        finished = ctx.adapter.sessions.finish(key)
        key = None
        stats = finished.stats
        if run.exit_code != 0 and not stats["turns"]:
            # It never reached the model: a CLI that cannot start (a broken tools install, an image it
            # cannot run in) is not the agent's doing, and there would be nothing to train on anyway.
            raise InfraError(f"the agent exited {run.exit_code} before calling the model: "
                             f"{run.stderr.decode(errors='replace').strip()[-800:]}")
        if run.exit_code != 0 and stats.get("upstream_unanswered"):
            # Left without a model at the end. Errors or aborts it got answers after (a weight update's
            # abort, a server restarted) are not why it stopped: its outcome is its own, graded.
            raise InfraError(f"the agent exited {run.exit_code} with its last {stats['upstream_unanswered']} model "
                             f"calls unanswered ({stats.get('upstream_errors', 0)} errors, "
                             f"{stats.get('upstream_aborts', 0)} aborts in all): the model server, not the agent, "
                             f"failed")
        empty = classify_empty_patch(run.exit_code, not (diff or b"").strip(), trajectory)
        if decide(cfg.empty_patch_policy, empty) == "retry" and diff is not None:
            raise InfraError(f"empty patch ({empty.value}) and empty_patch_policy=abort")
        metadata = AttemptMetadata(
            harness=cfg.harness, task=spec.instance_id, exit_code=run.exit_code, agent_timed_out=run.timed_out,
            empty_patch=empty, patch_bytes=len(diff or b""), limits=limits, drift=stats["drift"],
            branches=stats["branches"], turns=stats["turns"], tool_calls=trajectory.tool_calls,
            boot_s=round(timings["boot_s"], 3), agent_s=round(timings["agent_s"], 3),
            grade_s=round(timings["grade_s"], 3), adapter_s=round(float(stats.get("adapter_s", 0.0)), 4))
        samples = [chain.to_sample(reward=grade.reward, group_index=group, attempt=attempt, metadata=metadata)
                   for chain in finished.chains]
        return AttemptOutcome(samples, grade.reward, metadata, timings, patch=diff or b"", grade=grade, agent=run,
                              trajectory=trajectory, spans=[chain.spans for chain in finished.chains])
    finally:
        if key is not None:
            ctx.adapter.sessions.drop(key)
        shutil.rmtree(work, ignore_errors=True)


def _span(on_span: SpanSink, name: str, start: float) -> float:
    """Hand on the span from `start` to now; its length."""
    end = time.monotonic()
    on_span(name, start, end)
    return end - start


async def _broken_by_agent(sb, error: SandboxError, during: str, t0: float) -> ExecResult:
    """A sandbox that failed under the agent: its outcome if one of its limits was hit (the agent's
    processes filled its disk, took its memory or its pids), as the process result that says so;
    otherwise an infrastructure failure (InfraError, retried)."""
    try:
        hit = await episode.limits_or_raise(sb, error)
    except SandboxError:
        raise InfraError(f"sandbox, during {during}: {error}") from None
    log.info("the agent ran into its sandbox's %s limit (%s): an outcome, reward 0", ", ".join(hit), error)
    return ExecResult(-9, b"", f"[agentrl] {during} failed at the sandbox's {', '.join(hit)} limit: {error}".encode(),
                      time.monotonic() - t0)


def _report_limits(ctx: PoolContext, sb) -> None:
    if ctx.limits_reported:
        return
    unenforced = getattr(sb, "unenforced", None)
    if unenforced:
        log.warning(unenforced_message(unenforced))
    storage = getattr(sb, "storage", None) or {}
    if storage.get("backing") == "tmpfs" and storage.get("why"):      # auto fell back: RAM, not disk
        log.warning(fallback_message(storage["why"]))
    ctx.limits_reported = True


async def _grade(ctx: PoolContext, task: LoadedTask, spec, sb, diff: bytes, work: Path) -> episode.Grade:
    def fresh():
        # Isolated grading's sandbox: a fresh copy of the task (the agent's own is not trusted).
        repo = materialize(task.testbed, work / f"fresh-{secrets.token_hex(3)}") if task.testbed else None
        return task_sandbox(spec, runtime=ctx.cfg.runtime, cache=ctx.cache, workdir_source=repo,
                            scratch_dir=str(ctx.cfg.scratch_dir) if ctx.cfg.scratch_dir else None,
                            allow_unsafe_local=ctx.cfg.allow_unsafe_local, storage=ctx.cfg.sandbox_storage)
    return await grade_attempt(task, spec, sb, diff, ctx.cfg.grading, fresh)
