"""The trainer role: open a rollout, wait for its groups, close it, train, checkpoint, publish, next.

With `max_staleness` k > 0 it keeps rollouts r..r+k open while it trains rollout r, so the pool never
runs out of claims; what lags too far behind the policy is masked (agentrl/train/staleness.py).

Every rank runs this loop; rank 0 alone writes to the ledger, checkpoints, metrics and inference
servers, and the ranks meet at barriers. Rollout r asks the prompt source for absolute groups
[r*B, (r+1)*B), and rank 0 opens the rollout with what each group is (agentrl.prompts.groups): pool
workers read that and never recompute it, and a resumed run draws exactly the groups the
uninterrupted one would have. Rank 0 alone polls the ledger; its close fixes the groups trained on,
which every rank then reads (the other ranks wait for the close with one stat a poll). A trainer
killed mid-rollout resumes from `latest` and keeps the rollout's open generation and its commits.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hpc import liveness
from hpc.buffer import read_rollout
from hpc.fsio import write_atomic
from hpc.inference.sglang import SGLangClient
from hpc.ledger import Ledger
from hpc.registry import Registry
from hpc.runlayout import RunLayout

from ..pool.metrics import rollout_report
from ..prompts.groups import RolloutGroups, open_rollout, rollout_payload
from ..prompts.source import PromptSource, load_prompt_rows
from ..report.data import parse_metrics
from ..sample import SAMPLE_CODEC
from . import mismatch
from .batch import plan_steps, rollout_batch, shuffle_rewards
from .checkpoint import TrainerState, apply_retention, load_latest, save_checkpoint
from .config import TrainConfig
from .policy import Policy
from .publish import ColocatedInference, publish_weights
from .staleness import bound_staleness, staleness_bound
from .torch_backend import TorchPolicy, barrier, world
from .tracking import NoTracker, Tracker, make_tracker

log = logging.getLogger("agentrl.train")
POLL_S = 0.25             # a poll of the commits (one listing); what the trainer may oversleep a rollout's end
LOG_S = 5.0               # between progress lines, each a read of every lease
CLOSE_GRACE_S = 300.0     # beyond rollout_timeout_s, how long ranks > 0 wait for rank 0 to close a rollout


@dataclass
class Trainer:
    run: RunLayout
    cfg: TrainConfig
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    inference_client: Callable[[str], SGLangClient] | None = None    # tests record the calls
    tracker: Tracker = field(default_factory=NoTracker)
    liveness_file: Path | None = None     # beaten from the loop: polls, steps, saves (hpc.liveness)

    def __post_init__(self) -> None:
        self.rank, self.world_size = world()
        self.ledger = Ledger(self.run.ledger_dir)
        self.registry = Registry(self.run.services_dir)
        self.rows = load_prompt_rows(self.cfg.prompt_data)

    # ------------------------------------------------------------ one rollout's data

    def open_rollout(self, r: int, source: PromptSource) -> None:
        """Open rollout r, unless it is open already with these groups (a resumed trainer keeps what was
        committed); one opened with other groups or sampling (older code, other data) is reopened."""
        if self.rank != 0:
            return
        payload = rollout_payload(source, r, temperature=self.cfg.rollout_temperature)
        gen = self.ledger.current_generation(r)
        if gen is not None:
            found = self.ledger.spec(r, gen).payload
            if found is not None and RolloutGroups.parse(found, "ledger") == RolloutGroups.parse(payload, "trainer"):
                return
            log.warning("rollout %d: generation %d was opened with other groups or sampling; reopening it", r, gen)
        open_rollout(self.ledger, source, r, attempts=self.cfg.n_samples_per_prompt,
                     temperature=self.cfg.rollout_temperature, max_tries=self.cfg.max_tries)
        log.info("rollout %d: opened %d groups x %d attempts", r, self.cfg.rollout_batch_size,
                 self.cfg.n_samples_per_prompt)

    def wait_for_groups(self, r: int) -> list[int]:
        """Poll until enough groups are complete (or the timeout), logging progress every LOG_S as it changes.

        A poll is one listing of the commits (LedgerView.complete_groups), so it can be frequent: with
        rollouts ahead of training, every second the trainer oversleeps is a second it idles. The
        progress line needs every lease (LedgerView.status) and is made less often."""
        need = math.ceil(self.cfg.min_complete_fraction * self.cfg.rollout_batch_size)
        deadline, last, logged = self.clock() + self.cfg.rollout_timeout_s, None, -math.inf
        while True:
            complete = self.ledger.complete_groups(r)
            done = len(complete) >= self.cfg.rollout_batch_size
            if done or self.clock() - logged >= LOG_S:
                st, logged = self.ledger.status(r), self.clock()
                seen = (len(st.complete_groups), st.committed, st.claimed, st.failed)
                if seen != last:
                    log.info("rollout %d: %d/%d groups complete (%d needed); attempts %d committed, %d running, "
                             "%d failed, of %d", r, seen[0], self.cfg.rollout_batch_size, need, st.committed,
                             st.claimed, st.failed, st.total)
                    last = seen
            liveness.beat(self.liveness_file)
            if done:
                return complete
            if self.clock() >= deadline:
                if len(complete) >= need:
                    return complete
                raise TimeoutError(f"rollout {r}: only {len(complete)} of {need} needed groups completed "
                                   f"in rollout_timeout_s={self.cfg.rollout_timeout_s:g}: are pool workers running? "
                                   f"(agentrl ledger status {self.run.root})")
            self.sleep(POLL_S)

    def close_rollout(self, r: int) -> list[int] | None:
        """Rank 0 waits for the groups and closes the rollout; the others wait for its close. The
        groups the close fixed, the same on every rank."""
        if self.rank == 0:
            closed = self.ledger.closed(r)
            if closed is None:          # a resumed trainer may find it closed already: its groups stand
                self.wait_for_groups(r)
                closed = self.ledger.close_rollout(r)
            return closed.groups
        deadline = self.clock() + self.cfg.rollout_timeout_s + CLOSE_GRACE_S
        while (closed := self.ledger.closed(r)) is None:
            liveness.beat(self.liveness_file)
            if self.clock() >= deadline:
                raise TimeoutError(f"rank {self.rank}: rank 0 did not close rollout {r} within rollout_timeout_s + "
                                   f"{CLOSE_GRACE_S:g} s; see rank 0's log")
            self.sleep(POLL_S)
        return closed.groups

    # ------------------------------------------------------------ the loop

    def make_policy(self) -> Policy:
        if self.cfg.backend == "megatron":
            from .megatron_backend import MegatronPolicy, init_model_parallel

            init_model_parallel(self.cfg.megatron)
            return MegatronPolicy(self.cfg.model, self.cfg)
        return TorchPolicy(self.cfg.model, self.cfg)

    def train(self) -> TrainerState:
        cfg = self.cfg
        policy = self.make_policy()
        state = load_latest(self.run, policy)
        if state is not None:
            source = PromptSource.from_state(state.prompt_source, self.rows)
            log.info("resuming after rollout %d (checkpoint iter_%d)", state.iteration - 1, state.iteration)
        else:
            source = PromptSource(self.rows, rollout_batch_size=cfg.rollout_batch_size, shuffle=cfg.shuffle,
                                  seed=cfg.seed)
            state = TrainerState(iteration=0, optimizer_steps=0, weight_version=0, prompt_source=source.state())
        policy.steps = state.optimizer_steps
        if self.rank == 0 and state.metrics is not None:
            self._record_lost_line(state.metrics)
        if self.rank == 0:
            self.tracker = make_tracker(cfg.tracking, self.run.root, self.run.manifest().run_id,
                                        cfg.model_dump(mode="json"))
        try:
            for r in range(state.iteration, cfg.num_rollouts):
                state = self.one_rollout(r, source, policy, state)
        finally:
            self.tracker.close()
        return state

    def one_rollout(self, r: int, source: PromptSource, policy: Policy, state: TrainerState) -> TrainerState:
        cfg = self.cfg
        t0 = self.clock()
        for ahead in range(r, min(r + cfg.max_staleness, cfg.num_rollouts - 1) + 1):
            self.open_rollout(ahead, source)       # those open already are kept
        barrier()
        self.close_rollout(r)
        barrier()
        # The trainer's wait, and the rollout's own span from its opening (they differ with rollouts ahead)
        closed = self.ledger.closed(r)
        opened = self.ledger.spec(r, closed.generation).opened if closed else time.time()
        timing = {"wait_s": round(self.clock() - t0, 3), "rollout_s": round(time.time() - opened, 3)}
        colocated = None
        if cfg.colocated and self.rank == 0:
            # The rollout is closed: no sandbox waits on a generation when the servers let go of their memory.
            colocated = ColocatedInference([self._client(url) for url in self.inference_servers()])
            colocated.__enter__()
        try:
            return self._train_rollout(r, source, policy, state, colocated, timing)
        except BaseException:
            if colocated is not None:      # leave the servers generating (old weights) for the next trainer
                colocated.__exit__(None, None, None)
                colocated.resume(None, state.weight_version)
            raise

    def _train_rollout(self, r: int, source: PromptSource, policy: Policy, state: TrainerState,
                       colocated: ColocatedInference | None, timing: dict[str, float]) -> TrainerState:
        cfg = self.cfg
        barrier()
        groups = read_rollout(self.ledger, self.run.buffer_dir, r, SAMPLE_CODEC)     # the groups the close fixed
        trained_on = shuffle_rewards(groups, f"{cfg.seed}/{r}") if cfg.control == "shuffle_rewards" else groups
        batch = rollout_batch(trained_on, std_normalize=cfg.std_normalize)
        metrics: dict[str, Any] = {"rollout": r, **timing}
        if self.rank == 0:     # the true rewards, in a control run too
            metrics.update(rollout_report([s for g in sorted(groups) for s in groups[g]],
                                          ks=sorted({1, cfg.n_samples_per_prompt}), rollout_s=timing["rollout_s"],
                                          infra_failures=self.ledger.status(r).failed))
        # The policy has trained r rollouts: what lags more than the bound behind it leaves the loss.
        batch, staleness = bound_staleness(batch, policy_version=r, mask_unknown=cfg.max_staleness > 0,
                                           bound=staleness_bound(cfg.max_staleness, cfg.publish_every))
        metrics.update(staleness.metrics())
        t1 = self.clock()
        step_metrics = []
        if batch.samples:
            for k, plan in enumerate(plan_steps(batch, global_batch_size=cfg.global_batch_size,
                                                max_tokens_per_gpu=cfg.max_tokens_per_gpu, dp_size=policy.dp_size,
                                                rank=policy.dp_rank)):
                # Until its first step the policy holds the weights of version r: the sampler's, for the
                # tokens the servers sampled with them (mismatch.py); after it, the policy has moved.
                plan = replace(plan, mismatch_version=r if k == 0 else None)
                step_metrics.append(policy.train_step(batch, plan))
                liveness.beat(self.liveness_file)
                if self.rank == 0 and (problem := mismatch.warning(step_metrics[-1], cfg.mismatch_warn)):
                    log.warning("rollout %d, step %d (optimizer step %d): %s", r, k, policy.steps, problem)
            metrics.update({f"train/{k}": v for k, v in mismatch.rollout_metrics(step_metrics).items()})
        else:
            log.warning("rollout %d: every sample lags more than max_staleness behind the policy; no step", r)
        metrics["train_s"] = round(self.clock() - t1, 3)
        n = r + 1
        last = n == cfg.num_rollouts
        publish = (n % cfg.publish_every == 0 and not last) or (last and cfg.evals_after_last)
        full = n % cfg.save_every == 0 or last
        save = full or publish       # publishing needs only the export the servers load
        metrics["fingerprint"] = policy.fingerprint()
        state = TrainerState(iteration=n, optimizer_steps=policy.steps, weight_version=n if publish else
                             state.weight_version, prompt_source=source.state(), full=full, metrics=dict(metrics))
        if save:
            t2 = self.clock()
            save_checkpoint(self.run, policy, state, rank=self.rank, collective=policy.collective_io, barrier=barrier)
            metrics["checkpoint_s"] = round(self.clock() - t2, 3)
        if colocated is not None:
            t3 = self.clock()
            colocated.__exit__(None, None, None)
            colocated.resume(self.run.checkpoint_dir(n) / "hf" if publish else None, n)
            if publish:
                self.run.publish_weights(n, self.run.checkpoint_dir(n) / "hf")
                metrics.update({"weight_version": n, "publish_s": round(self.clock() - t3, 3),
                                "inference_servers": len(colocated.clients)})
        elif publish and self.rank == 0:
            # Recorded first: a server that (re)starts meanwhile loads these weights itself
            self.run.publish_weights(n, self.run.checkpoint_dir(n) / "hf")
            times = publish_weights(self.inference_servers, self.run.checkpoint_dir(n) / "hf", n,
                                    timeout_s=cfg.publish_timeout_s, client=self._client)
            metrics.update({"weight_version": n, "publish_s": round(max(times.values(), default=0.0), 3),
                            "inference_servers": len(times)})
        if save and self.rank == 0:
            apply_retention(self.run, keep_last=cfg.keep_last, keep_exports=cfg.keep_exports)
        barrier()
        liveness.beat(self.liveness_file)
        self._record(metrics)
        return state

    def _client(self, url: str) -> SGLangClient:
        return self.inference_client(url) if self.inference_client else SGLangClient(url, self.cfg.publish_timeout_s)

    def inference_servers(self) -> list[str]:
        return [f"http://{s.host}:{s.port}" for s in self.registry.alive("inference") if s.port]

    def _record_lost_line(self, metrics: dict[str, Any]) -> None:
        """The resumed-from checkpoint's rollout line, where metrics.jsonl lacks it (the trainer died
        between the save and the line: publishing failed, or it was killed). Idempotent."""
        path = self.run.metrics_path
        written = parse_metrics(path.read_text(errors="replace") if path.exists() else "").records
        if any(m["rollout"] == metrics["rollout"] for m in written):
            return
        log.warning("rollout %d: metrics.jsonl lacks its line (the trainer stopped after its checkpoint); "
                    "written from the checkpoint, without what came after the save", metrics["rollout"])
        self._append_line({**metrics, "recovered_from_checkpoint": True})

    def _append_line(self, metrics: dict[str, Any]) -> None:
        with open(self.run.metrics_path, "a") as f:
            f.write(json.dumps({"kind": "train", "time": time.time(), **metrics}) + "\n")

    def _record(self, metrics: dict[str, Any]) -> None:
        """metrics.jsonl gets rank 0's line; every rank leaves its model fingerprint (ranks must agree)."""
        fingerprints = self.run.logs_dir / f"train-rank{self.rank}.json"
        fingerprints.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(fingerprints, json.dumps({"rollout": metrics["rollout"],
                                               "fingerprint": metrics["fingerprint"]}).encode())
        if self.rank == 0:
            self._append_line(metrics)
            self.tracker.log(metrics, step=metrics["rollout"])
            log.info("rollout %d: reward %.3f over %d attempts, %d samples; loss %.4f; %.1fs rollout (%.1fs waited "
                     "for), %.1fs train", metrics["rollout"], metrics["reward_mean"], metrics["attempts"],
                     metrics["samples"], metrics.get("train/loss", float("nan")), metrics["rollout_s"],
                     metrics["wait_s"], metrics["train_s"])

