"""`agentrl sft`: supervised fine-tuning on recorded samples, the warm start a policy needs before RL.

A random policy never emits a tool call, so no attempt earns a reward and every advantage is 0.
The samples to start from are the token-exact ones the adapter records for any agent: the
committed shards of a run (`agentrl sft RUN_DIR`), or shard files from anywhere (a pool run with
a stronger model upstream, say: distillation). Every token a sample's loss mask marks (the
model's own turns) is trained with cross-entropy; prompts and tool output are context only.

    agentrl sft SOURCE... --model DIR --out DIR [--epochs 3] [--lr 1e-4] [--min-reward 1]
                          [--max-tokens-per-step 8192] [--seed 0]

SOURCE is a run directory (the committed samples of every rollout, through its ledger), a shard
file, or a directory of shard files. The result is a Hugging Face directory, what `model:` and
the inference servers take.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from hpc.buffer import read_rollout, read_shard
from hpc.fsio import write_atomic
from hpc.ledger import Ledger
from hpc.records import RecordError
from hpc.validation import problems

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
    if (src / "ledger").is_dir() and (src / "buffer").is_dir():
        ledger = Ledger(src / "ledger")
        return [s for r in ledger.rollouts() for g in read_rollout(ledger, src / "buffer", r, SAMPLE_CODEC).values()
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", type=Path, help="run directories, shard files, or directories of shards")
    p.add_argument("--model", type=Path, required=True, help="the Hugging Face model directory to start from")
    p.add_argument("--out", type=Path, required=True, help="where the fine-tuned model is written")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--max-tokens-per-step", type=int, default=8192)
    p.add_argument("--min-reward", type=float, default=None,
                   help="train only on samples whose attempt earned at least this (say 1: only successes)")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = SFTConfig(model=args.model, out=args.out, epochs=args.epochs, lr=args.lr,
                        max_tokens_per_step=args.max_tokens_per_step, min_reward=args.min_reward, seed=args.seed)
        if not (cfg.model / "config.json").is_file():
            raise SFTError(f"--model {cfg.model} holds no config.json (a Hugging Face model directory)")
        samples = load_samples(args.sources)
        history = run_sft(cfg, samples, progress=lambda m: print(m, file=sys.stderr, flush=True))
    except ValidationError as e:
        print("\n".join(f"agentrl sft: --{f.replace('_', '-')}: {m}" for f, m in problems(e)), file=sys.stderr)
        return 2
    except (SFTError, RecordError) as e:
        print(f"agentrl sft: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": str(cfg.out), "steps": len(history), "first_loss": history[0]["loss"],
                      "last_loss": history[-1]["loss"]}))
    return 0
