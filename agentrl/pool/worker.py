"""The pool worker role: claim attempts, run them in sandboxes against a local adapter, commit their samples.

What a group is (its prompt row, the task's id, the sampling temperature) is read from the rollout's
spec, as the trainer opened it (agentrl.prompts.groups), never recomputed here. Before claiming
anything of a rollout the worker checks its own prompt data is the trainer's (same sha256) and that
its config samples at the trainer's temperature; if not it refuses the rollout and stops
(`RolloutGroupsError`, `PoolConfigError`), with no try of any attempt spent.

One worker per CPU node. It serves one adapter (a Unix socket that every sandbox gets) and runs
attempts concurrently: at most `max_booting` sandboxes booting or grading and `max_agents` agents
at once. Each attempt's lease is renewed while it runs; a lost lease cancels the attempt (another
worker has it). An attempt starts only once a model server answers /health: while none does (one
killed and restarting), claimed attempts wait under their leases instead of failing, so that an
outage of the server does not spend the tries of every attempt in reach (max_tries). One bad
attempt never stops the worker: an infrastructure failure fails the claim (the ledger retries it
within max_tries), anything unexpected is logged and failed the same way.

Timing (benchmarks/rollout_bench.py): `on_span(claim, name, start, end)`, in time.monotonic seconds,
hears each of SPANS of every attempt as it ends: its claim, the whole run_attempt, the phases inside it
(agentrl.pool.attempt.ATTEMPT_SPANS), the shard write and the commit. claim, shard and commit are
timed in the thread that does the work, and heard there, so that a span is the work and not the
hand-off to a thread: on_span must be thread-safe. Unset, the spans cost a few clock reads per attempt.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from hpc import liveness
from hpc.claims import ClaimLoop
from hpc.ledger import Claim, Ledger
from hpc.ledger_records import RolloutSpec
from hpc.registry import Registry
from hpc.runlayout import RunLayout

from ..adapter.service import Adapter
from ..prompts.groups import RolloutGroups, check_rows
from ..prompts.source import load_prompt_rows, rows_fingerprint
from ..swe.loaded import LoadedTask, load_record
from ..swe.task import TaskSpecError
from .attempt import ATTEMPT_SPANS, PoolContext, SpanSink, no_span
from .claimed import AttemptRecords, adapter_config, attempt_context, default_tools_dir, fail_claim, run_claimed
from .config import PoolConfig

log = logging.getLogger("agentrl.pool")
REGISTRY_BEAT_S = 5.0          # the registry counts a service alive for 30 s after its last beat
SPANS = ("claim", "attempt", *ATTEMPT_SPANS, "shard", "commit")
ClaimSpanSink = Callable[[Claim, str, float, float], None]     # (claim, name, start, end)


@dataclass
class PoolWorker:
    run: RunLayout
    cfg: PoolConfig
    tokenizer: Path              # the trained model's (train.model)
    prompt_data: Path            # train.prompt_data: must be the trainer's rows
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    index: int = 0
    counts: Counter = field(default_factory=Counter)
    liveness_file: Path | None = None     # touched while the worker's event loop runs (hpc.liveness)
    on_span: ClaimSpanSink | None = None  # hears each of SPANS (see above)

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.run.ledger_dir)
        self.rows = load_prompt_rows(self.prompt_data)
        self.rows_sha256 = rows_fingerprint(self.rows)
        self._rollouts: dict[tuple[int, int], RolloutGroups] = {}    # (rollout, generation) -> its groups
        self._tasks: dict[int, LoadedTask] = {}
        self.tools_dir = default_tools_dir(self.cfg)
        self.records = AttemptRecords(self.run.trajectories_dir, per_rollout=True, shards=self.run.buffer_dir)

    def check_rollout(self, spec: RolloutSpec) -> None:
        """Raise unless this worker can do the rollout's work: the trainer's prompt data, its temperature."""
        key = (spec.rollout_id, spec.generation)
        if key not in self._rollouts:
            groups = RolloutGroups.parse(spec.payload, f"rollout {spec.rollout_id} generation {spec.generation}")
            check_rows(groups, self.rows, self.rows_sha256, where=str(self.prompt_data))
            self.cfg.sampling(groups.temperature)
            self._rollouts[key] = groups

    def groups_of(self, claim: Claim) -> RolloutGroups:
        key = (claim.rollout_id, claim.generation)
        if key not in self._rollouts:
            self.check_rollout(self.ledger.spec(*key))
        return self._rollouts[key]

    def task_for(self, claim: Claim) -> LoadedTask:
        groups = self.groups_of(claim)
        record = groups.task(claim.group, self.rows)     # refuses a group it did not open, a row of another task
        row = groups.groups[claim.group].row
        if row not in self._tasks:
            self._tasks[row] = load_record(record)
        return self._tasks[row]

    def adapter(self) -> Adapter:
        return Adapter(adapter_config(self.cfg, self.tokenizer, registry=self.run.root))

    async def serve(self, stop: asyncio.Event, *, max_attempts: int | None = None) -> Counter:
        """Run until `stop` is set (or after `max_attempts`); the counts of what happened."""
        cfg = self.cfg
        registry = Registry(self.run.services_dir)
        record = None

        async def beat() -> None:     # alive, busy or not: to the launcher, and in the run's registry once there
            nonlocal record
            while True:
                liveness.beat(self.liveness_file)
                if record is not None:
                    record = await asyncio.to_thread(registry.heartbeat, record)
                await asyncio.sleep(REGISTRY_BEAT_S)
        beating = asyncio.create_task(beat())
        sock_dir = Path(cfg.scratch_dir or "/tmp") / f"agentrl-pool-{self.worker_id}"
        try:
            async with attempt_context(cfg, self.adapter(), sock_dir, self.tools_dir) as ctx:
                record = registry.register("pool", self.index, host=socket.gethostname(), socket=ctx.adapter_socket)
                on_claim = None if self.on_span is None else partial(_claim_span, self.on_span)
                loop = ClaimLoop(self.ledger, self.worker_id, cfg.lease_s, cfg.poll_s,
                                 cfg.max_agents + cfg.max_booting, check=self.check_rollout, counts=self.counts,
                                 on_claim=on_claim)
                try:
                    await loop.run(lambda claim: self._attempt(ctx, claim), stop=stop, max_claims=max_attempts)
                finally:
                    registry.deregister(record)
        finally:
            beating.cancel()
        return self.counts

    async def _attempt(self, ctx: PoolContext, claim: Claim) -> None:
        """One claim's attempt, to its commit or fail (a lost lease cancels it: hpc.claims)."""
        where = f"rollout {claim.rollout_id} group {claim.group} attempt {claim.attempt} try {claim.try_index}"
        try:
            task = self.task_for(claim)
            sampling = self.cfg.sampling(self.groups_of(claim).temperature)
        except (TaskSpecError, ValueError, KeyError) as e:
            # The prompt data's record cannot be a task (hostile or broken data): the claim fails, named,
            # and the ledger's bound on tries ends it; it must not escape the attempt and the worker.
            self.counts["bad_tasks"] += 1
            log.error("%s: the task's record is invalid: %s", where, e)
            await fail_claim(self.ledger, claim, f"task: {e}")
            return
        span: SpanSink = no_span if self.on_span is None else partial(self.on_span, claim)
        await run_claimed(ctx, self.ledger, claim, task, sampling, self.records, self.counts, where=where,
                          on_span=span)


def _claim_span(on_span: ClaimSpanSink, claim: Claim, start: float, end: float) -> None:
    on_span(claim, "claim", start, end)

