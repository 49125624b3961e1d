"""From a claimed attempt to its commit: the one path the pool worker and eval both take.

    attempt_context(...)    what every attempt of one worker shares: the harness installed, the
                            adapter served on a Unix socket, the bounds on booting and running
                            agents, the image cache (PoolContext); the socket gone at the end
    run_claimed(...)        one claim: wait for a model server, run the attempt (agentrl.pool.attempt),
                            write its trace, its shard and (eval) its result, commit; or fail the claim
                            with the reason, so the ledger retries it within its bound

Where the records go is the caller's (AttemptRecords): the pool commits the shard it wrote into the
run's buffer; eval commits a result file per try and keeps the samples only when asked. What is
recorded of an attempt is its AttemptMetadata (agentrl.sample), in both: a field added there reaches
the pool's samples and eval's results alike.

Failures: an InfraError or an unexpected exception fails the claim and is counted (infra_failures,
errors); so does a filesystem that refuses the shard, the result or the commit (io_errors). A
superseded generation (StaleGeneration) or another try's commit leaves the attempt uncommitted
("stale") and its shard removed: it is never read. A trace the filesystem refuses is only logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hpc.buffer import write_shard
from hpc.fsio import write_new
from hpc.images.cache import ImageCache
from hpc.ledger import Claim, Ledger, StaleGeneration

from ..adapter.serve import AdapterServer
from ..adapter.service import Adapter, AdapterConfig
from ..harness import get_harness
from ..sample import SAMPLE_CODEC
from ..swe.loaded import LoadedTask
from .attempt import AttemptOutcome, InfraError, PoolContext, SpanSink, no_span, run_attempt
from .config import PoolConfig
from .trace import trace_path, write_trace

log = logging.getLogger("agentrl.pool")
T = TypeVar("T")


@dataclass(frozen=True)
class AttemptRecords:
    """Where one worker's claims leave their records."""
    trajectories: Path                 # traces (agentrl.pool.trace)
    per_rollout: bool                  # under rollout_<r>/g<gen>/ (the pool) or flat (an eval's iteration)
    shards: Path | None                # the samples as a buffer shard; None: not kept
    # eval: a result file per try (result_record), committed as the attempt's ref, relative to this
    # directory's parent; None: the shard is the ref
    results: Path | None = None

    def __post_init__(self) -> None:
        if self.shards is None and self.results is None:
            raise ValueError("an attempt commits its shard or its result: give shards or results")


def adapter_config(cfg: PoolConfig, tokenizer: Path, *, upstreams: list[str] | None = None,
                   registry: Path | None = None) -> AdapterConfig:
    """The adapter's settings from the pool's, its model servers given (URLs, or a run's registry): one place,
    whoever serves the attempts."""
    return AdapterConfig(**cfg.adapter.model_dump(), tokenizer=tokenizer, upstreams=upstreams or [], registry=registry)


def default_tools_dir(cfg: PoolConfig) -> Path:
    # Shared by runs: the CLIs are hundreds of MB. On a cluster, point it at the shared filesystem.
    return cfg.tools_dir or Path.home() / ".cache" / "agentrl" / "tools"


@asynccontextmanager
async def attempt_context(cfg: PoolConfig, adapter: Adapter, sock_dir: Path,
                          tools_dir: Path) -> AsyncIterator[PoolContext]:
    """The harness installed into tools_dir, `adapter` served on sock_dir/adapter.sock (every sandbox
    gets it), the pool's bounds and image cache: what run_claimed needs. The socket's directory is
    removed at the end: nothing of a worker outlives it."""
    try:
        await asyncio.to_thread(get_harness(cfg.harness).install, tools_dir)
        sock_dir.mkdir(parents=True, exist_ok=True)
        sock_dir.chmod(0o755)   # the agent (uid 1000) reaches the socket through it
        socket_path = str(sock_dir / "adapter.sock")
        server = AdapterServer(adapter, uds=socket_path)
        serving = asyncio.ensure_future(server.serve())
        try:
            yield PoolContext(cfg, adapter, socket_path, tools_dir, asyncio.Semaphore(cfg.max_booting),
                              asyncio.Semaphore(cfg.max_agents),
                              ImageCache(cfg.image_cache) if cfg.image_cache else None)
        finally:
            server.request_stop()
            await serving
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def result_record(claim: Claim, outcome: AttemptOutcome) -> dict[str, Any]:
    """An eval result: the attempt's metadata, its reward and its phases' lengths."""
    return {**outcome.metadata.model_dump(mode="json"), "attempt": claim.attempt, "reward": outcome.reward,
            "timings": outcome.timings}


async def run_claimed(ctx: PoolContext, ledger: Ledger, claim: Claim, task: LoadedTask,
                      sampling: Mapping[str, Any], records: AttemptRecords, counts: Counter, *,
                      where: str, on_span: SpanSink = no_span) -> AttemptOutcome | None:
    """Claim to commit (see the module's doc); the outcome, or None when the claim failed."""
    started = time.monotonic()
    # No server up (killed, restarting, warming): wait under the renewed lease rather than spend a try
    await ctx.adapter.pool.wait_healthy(what=where)
    try:
        outcome = await run_attempt(ctx, task, group=claim.group, attempt=claim.attempt, sampling=sampling,
                                    on_span=on_span)
    except InfraError as e:
        counts["infra_failures"] += 1
        log.warning("%s: infrastructure failure, to be retried: %s", where, e)
        await fail_claim(ledger, claim, f"infra: {e}")
        return None
    except Exception as e:   # noqa: BLE001 - one bad attempt must not stop the worker
        counts["errors"] += 1
        log.error("%s: unexpected error, to be retried:\n%s", where, traceback.format_exc())
        await fail_claim(ledger, claim, f"error: {e!r}")
        return None
    on_span("attempt", started, time.monotonic())
    await asyncio.to_thread(write_trace, trace_path(records.trajectories, claim, per_rollout=records.per_rollout),
                            claim, outcome)
    shard: Path | None = None
    try:
        ref = None
        if records.shards is not None:
            ref = await asyncio.to_thread(_timed, on_span, "shard", write_shard, records.shards, claim,
                                          outcome.samples, SAMPLE_CODEC)
            shard = records.shards / ref
        if records.results is not None:
            name = f"{claim.group}-{claim.attempt}-{claim.try_index}.json"
            await asyncio.to_thread(write_new, records.results / name,
                                    json.dumps(result_record(claim, outcome)).encode())
            ref = f"{records.results.name}/{name}"
        assert ref is not None     # AttemptRecords has one or the other
        committed = await asyncio.to_thread(_timed, on_span, "commit", ledger.commit, claim, ref)
    except StaleGeneration as e:
        committed = False
        log.warning("%s: not committed: %s", where, e)
    except OSError as e:     # the shared filesystem refused the shard or the commit: another try may land
        counts["io_errors"] += 1
        log.error("%s: its records or their commit could not be written, to be retried: %s", where, e)
        await fail_claim(ledger, claim, f"io: {e}")
        return None
    if not committed and shard is not None:
        shard.unlink(missing_ok=True)          # never read: another try's, or a superseded generation's
    counts["committed" if committed else "stale"] += 1
    counts["samples"] += len(outcome.samples)
    log.info("%s: reward %g, %d samples, %s", where, outcome.reward, len(outcome.samples),
             ", ".join(f"{k} {v:.1f}s" for k, v in outcome.timings.items()))
    return outcome


async def fail_claim(ledger: Ledger, claim: Claim, reason: str) -> None:
    await asyncio.to_thread(ledger.fail, claim, reason[:2000])   # a superseded claim's fail is ignored


def _timed(span: SpanSink, name: str, work: Callable[..., T], *args: Any) -> T:
    """`work(*args)`, its time handed to `span` as `name` (raised or not)."""
    start = time.monotonic()
    try:
        return work(*args)
    finally:
        span(name, start, time.monotonic())
