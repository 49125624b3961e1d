"""Scoring one checkpoint: every task n times, graded, into eval/iter_<n>/ (results.jsonl, summary.json).

    eval/iter_<n>/ledger/          which (task, attempt) is claimed or done: a killed eval resumes without
                                   redoing finished attempts, and two evaluators never run the same one
                                   (the claim loop is the pool's: hpc.claims; a lost lease cancels)
    eval/iter_<n>/attempts/<t>-<a>.json   one attempt's result (written whole, once)
    eval/iter_<n>/results.jsonl    one line per attempt, sorted, no timings: the same checkpoint, tasks
                                   and seed give the same file
    eval/iter_<n>/summary.json     pass@1, pass@k, empty patches, infra failures, timings, the config;
                                   written last: an iteration with it is scored
    eval/iter_<n>/trajectories/<g>-<a>-<try>.json  the attempt's trace: patch, grader's output, the
                                   agent's exit (agentrl.pool.trace; `agentrl view` reads it)
    eval/iter_<n>/samples/         with save_samples: each committed attempt's samples as a buffer
                                   shard, for `agentrl sft` (the teacher's demonstrations, say)

The model is served for the duration by an inference server on the checkpoint's HF export (the CPU
stand-in, or SGLang on a GPU node) and an adapter of the evaluator's own, on a Unix socket in its
scratch directory: never a fixed port that a training adapter may claim later. Each attempt takes the
pool worker's path from claim to commit (agentrl.pool.claimed), with the `eval.pool` settings: the
same sandboxes, image cache, limits and failure rules.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections import Counter
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from hpc.claims import ClaimLoop
from hpc.fsio import write_atomic
from hpc.launch.distenv import free_port
from hpc.ledger import Claim, Ledger
from hpc.runlayout import EvalLayout

from ..adapter.service import Adapter
from ..pool.attempt import PoolContext
from ..pool.claimed import AttemptRecords, adapter_config, attempt_context, default_tools_dir, run_claimed
from ..pool.metrics import pass_at_k
from ..swe.loaded import LoadedTask
from .config import EvalConfig

log = logging.getLogger("agentrl.eval")
RESULT_KEYS = ("task", "attempt", "reward", "exit_code", "agent_timed_out", "empty_patch", "patch_bytes", "turns",
               "tool_calls", "limits")


def attempt_seed(seed: int, task: str, attempt: int) -> int:
    """A sampling seed per (task, attempt): the same whatever order or evaluator runs it."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{task}/{attempt}".encode()).digest()[:4], "little")


@contextmanager
def model_server(cfg: EvalConfig, model_dir: Path, iteration: int, logs: Path):
    """An inference server on the checkpoint for the duration; its URL."""
    if cfg.engine in ("cpu", "teacher"):
        from hpc.inference.cpu_server import SERVER_THREADS, Engine, ServerThread, torch_threads

        engine: Engine
        if cfg.engine == "teacher":
            from ..swe.teacher import TeacherEngine

            engine = TeacherEngine(model_dir, accuracy=cfg.teacher_accuracy, seed=cfg.seed,
                                   weight_version=str(iteration))
        else:
            engine = Engine(model_dir, weight_version=str(iteration), random_seed=cfg.seed)
        with torch_threads(SERVER_THREADS), ServerThread(engine) as server:
            yield server.url
        return
    from hpc.inference.sglang import ServerProcess, SGLangConfig

    sglang = SGLangConfig(**cfg.sglang.model_dump(), model_path=model_dir, port=free_port("127.0.0.1"),
                          host="127.0.0.1", weight_version=str(iteration))
    with ServerProcess.of(sglang, logs / f"eval-sglang-{iteration}.log") as server:
        server.start()
        yield f"http://127.0.0.1:{sglang.port}"


class CheckpointEval:
    def __init__(self, out_dir: Path, cfg: EvalConfig, tasks: Sequence[LoadedTask], iteration: int,
                 worker_id: str | None = None):
        self.out, self.cfg, self.tasks, self.iteration = Path(out_dir), cfg, list(tasks), iteration
        self.layout = EvalLayout(self.out)
        self.worker_id = worker_id or f"eval-{socket.gethostname()}-{os.getpid()}"
        self.records = AttemptRecords(self.layout.trajectories_dir, per_rollout=False,
                                      shards=self.layout.samples_dir if cfg.save_samples else None,
                                      results=self.layout.attempts_dir)
        self.counts: Counter = Counter()

    @property
    def done(self) -> bool:
        return self.layout.summary_path.exists()

    def ledger(self) -> Ledger:
        """The iteration's ledger, opened once whoever gets here first (`Ledger.open_once`)."""
        self.layout.attempts_dir.mkdir(parents=True, exist_ok=True)
        ledger = Ledger(self.layout.ledger_dir)
        # Reopening would be a new generation, orphaning another evaluator's claims: the first one opens.
        mine = {"tasks": [t.spec.instance_id for t in self.tasks], "n": self.cfg.n_samples}
        found = ledger.open_once(0, list(range(len(self.tasks))), self.cfg.n_samples, self.cfg.max_tries,
                                 payload=mine).payload
        if found != mine:
            raise ValueError(f"{self.out} was opened for other tasks or n ({len((found or {}).get('tasks', []))} "
                             f"tasks, n={(found or {}).get('n')}): use another --out, or the same task set")
        return ledger

    async def run(self, model_dir: Path) -> dict[str, Any]:
        cfg, pool = self.cfg, self.cfg.pool
        ledger = self.ledger()
        logs = self.layout.logs_dir
        logs.mkdir(exist_ok=True)
        sock_dir = Path(pool.scratch_dir or "/tmp") / f"agentrl-{self.worker_id}"
        with model_server(cfg, model_dir, self.iteration, logs) as url:
            adapter = Adapter(adapter_config(pool, model_dir, upstreams=[url]))
            async with attempt_context(pool, adapter, sock_dir, default_tools_dir(pool)) as ctx:
                await self._attempts(ledger, ctx)
        return self.summarize(ledger)

    async def _attempts(self, ledger: Ledger, ctx: PoolContext) -> None:
        pool = self.cfg.pool
        loop = ClaimLoop(ledger, self.worker_id, pool.lease_s, pool.poll_s, pool.max_agents + pool.max_booting,
                         rollout_id=0, counts=self.counts)
        await loop.run(lambda claim: self._one(ledger, ctx, claim), until_done=True)

    async def _one(self, ledger: Ledger, ctx: PoolContext, claim: Claim) -> None:
        name = self.tasks[claim.group].spec.instance_id
        sampling = {"temperature": self.cfg.temperature, "top_p": self.cfg.top_p,
                    "max_new_tokens": self.cfg.pool.adapter.max_new_tokens,
                    "sampling_seed": attempt_seed(self.cfg.seed, name, claim.attempt)}
        await run_claimed(ctx, ledger, claim, self.tasks[claim.group], sampling, self.records, self.counts,
                          where=f"{name} attempt {claim.attempt} try {claim.try_index}")

    def summarize(self, ledger: Ledger) -> dict[str, Any]:
        """results.jsonl and summary.json from the committed attempts (the summary last)."""
        st = ledger.status(0)
        results = [json.loads((self.out / c.ref).read_text()) for _, c in sorted(ledger.commits(0).items())]
        for r in results:
            r.setdefault("limits", [])      # an attempt evaluated before limits were recorded
        lines = [json.dumps({k: r[k] for k in RESULT_KEYS}, sort_keys=True)
                 for r in sorted(results, key=lambda r: (r["task"], r["attempt"]))]
        write_atomic(self.layout.results_path, ("\n".join(lines) + "\n").encode())
        by_task: dict[str, list[float]] = {}
        for r in results:
            by_task.setdefault(r["task"], []).append(r["reward"])
        n = self.cfg.n_samples
        complete = [v for v in by_task.values() if len(v) == n]
        summary: dict[str, Any] = {
            "iteration": self.iteration, "k": n, "tasks": len(self.tasks), "attempts": len(results),
            "attempts_failed": st.failed, "infra_failures": ledger.failures(0),
            "pass@1": float(np.mean([r["reward"] > 0 for r in results])) if results else None,
            f"pass@{n}": float(np.mean([pass_at_k(n, sum(x > 0 for x in v), n) for v in complete]))
            if complete else None,
            "empty_patch_rate": float(np.mean([r["empty_patch"] not in (None, "not_triggered") for r in results]))
            if results else None,
            "timings": {k: float(np.mean([r["timings"][k] for r in results if k in r["timings"]]))
                        for k in ("boot_s", "agent_s", "grade_s") if any(k in r["timings"] for r in results)},
            "config": json.loads(self.cfg.model_dump_json()),
        }
        summary["pass@k"] = summary[f"pass@{n}"]
        write_atomic(self.layout.summary_path, json.dumps(summary, indent=1).encode())
        return summary


async def score(out_dir: Path, model_dir: Path, cfg: EvalConfig, tasks: Sequence[LoadedTask],
                iteration: int) -> dict[str, Any]:
    """Score (or finish scoring) one checkpoint; returns its summary (read back if it was done)."""
    ev = CheckpointEval(out_dir, cfg, tasks, iteration)
    if ev.done:
        return json.loads(ev.layout.summary_path.read_text())
    return await ev.run(model_dir)
