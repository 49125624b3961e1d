"""Supervised fine-tuning on recorded samples, the warm start a policy needs before RL (`agentrl sft`).

A random policy never emits a tool call, so no attempt earns a reward and every advantage is 0.
The samples to start from are the token-exact ones the adapter records for any agent: the
committed shards of a run, or shard files from anywhere (a pool run with a stronger model upstream,
say: distillation). Every token a sample's loss mask marks (the model's own turns) is trained with
cross-entropy; prompts and tool output are context only. The result is a Hugging Face directory.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from hpc.buffer import read_rollout, read_shard
from hpc.fsio import write_atomic
from hpc.ledger import Ledger
from hpc.runlayout import RunLayout

from ..sample import SAMPLE_CODEC, Sample
from .config import SFTConfig


class SFTError(ValueError):
    """Bad input for `agentrl sft`; the message names it and says what to give instead."""


def load_samples(sources: list[Path]) -> list[Sample]:
    """Every sample of the sources, in a stable order; SFTError naming a source that holds none."""
    out: list[Sample] = []
    for src in sources:
        found = _samples_of(Path(src))
        if not found:
            raise SFTError(f"{src}: holds no samples (give a run directory, a .msgpack shard, or a directory "
                           "of shards)")
        out += found
    return out


def _samples_of(src: Path) -> list[Sample]:
    if not src.exists():
        raise SFTError(f"{src}: does not exist")
    run = RunLayout(src)
    if run.ledger_dir.is_dir() and run.buffer_dir.is_dir():
        ledger = Ledger(run.ledger_dir)
        return [s for r in ledger.rollouts() for g in read_rollout(ledger, run.buffer_dir, r, SAMPLE_CODEC).values()
                for s in g]
    shards = [src] if src.is_file() else sorted(src.rglob("*.msgpack"))
    return [s for p in shards for s in read_shard(p, SAMPLE_CODEC)[1]]


def step_batches(samples: list[Sample], max_tokens: int, rng: random.Random) -> list[list[int]]:
    """Sample indices in steps of at most `max_tokens` tokens (a longer sample is a step alone), shuffled."""
    order = list(range(len(samples)))
    rng.shuffle(order)
    steps: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i in order:
        n = len(samples[i].tokens)
        if current and tokens + n > max_tokens:
            steps.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    if current:
        steps.append(current)
    return steps


def run_sft(cfg: SFTConfig, samples: list[Sample], progress=None) -> list[dict[str, float]]:
    """Train `cfg.model` on the samples for cfg.epochs and write the result to cfg.out; per-step metrics."""
    from .batch import RolloutBatch
    from .torch_backend import TorchPolicy

    if cfg.min_reward is not None:
        samples = [s for s in samples if s.reward >= cfg.min_reward]
    samples = [s for s in samples if s.loss_mask.any()]
    if not samples:
        raise SFTError("no sample to train on: none has a trained token" +
                       (f" and a reward of at least {cfg.min_reward:g}" if cfg.min_reward is not None else ""))
    policy = TorchPolicy(cfg.model, cfg)
    batch = RolloutBatch(samples, np.ones(len(samples)), [(s.group_index, s.attempt) for s in samples])
    rng, history = random.Random(cfg.seed), []
    for epoch in range(cfg.epochs):
        for k, step in enumerate(step_batches(samples, cfg.max_tokens_per_step, rng)):
            metrics = {"epoch": epoch, **policy.sft_step(batch, step)}
            history.append(metrics)
            if progress:
                progress(f"epoch {epoch + 1}/{cfg.epochs} step {k + 1}: loss {metrics['loss']:.4f} "
                         f"({metrics['tokens']:.0f} tokens)")
    cfg.out.mkdir(parents=True, exist_ok=True)
    policy.export_hf(cfg.out)
    write_atomic(cfg.out / "sft.json", json.dumps({"samples": len(samples), "steps": len(history),
                                                   "config": json.loads(cfg.model_dump_json()),
                                                   "history": history}, indent=1).encode())
    return history
