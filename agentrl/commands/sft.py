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
import sys
from pathlib import Path

from pydantic import ValidationError

from hpc.records import RecordError
from hpc.validation import problems

from ..train.config import SFTConfig
from ..train.sft import SFTError, load_samples, run_sft


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
