"""Checkpoint bytes on disk after N rollouts: bounded retention against writing everything every rollout.

Both sides publish weights every rollout and write through the trainer's own save_checkpoint, on a
Qwen2 of hidden size 256 and 4 layers (train_bench's), with AdamW's moments filled by one step:
    figure:   full state every --save-every rollouts and at the end, the HF export alone between; the
              newest --keep-last full states kept; an export dropped once its eval summary exists (an
              eval watcher one rollout behind: summaries appear for n - 1 after rollout n)
    baseline: what the trainer did before: every publish forced a full checkpoint, and none was pruned
bytes = du of checkpoints/ after the last rollout; ratio = figure / baseline (below 1 is smaller).
A full checkpoint is four times an export here (the weights, Adam's two moments and the export,
against the export alone, all float32), so the ratio depends on the rollout counts, not the model's size.

    python -m benchmarks.checkpoint_bench [--rollouts 20] [--save-every 5] [--keep-last 2] [--dir DIR] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import subprocess
import tempfile

from agentrl.train.checkpoint import TrainerState, apply_retention, save_checkpoint
from benchmarks.train_bench import FULL, bench_model, train_config
from hpc.runlayout import RunLayout

ROOT = Path(__file__).resolve().parents[1]


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True,
                              check=True).stdout.split()[0]) * 1024


def run_side(root: Path, policy, rollouts: int, *, bounded: bool, save_every: int, keep_last: int) -> int:
    run = RunLayout.create(root)
    for n in range(1, rollouts + 1):
        full = not bounded or n % save_every == 0 or n == rollouts
        state = TrainerState(iteration=n, optimizer_steps=n, weight_version=n, prompt_source={}, full=full)
        save_checkpoint(run, policy, state)
        run.publish_weights(n, run.checkpoint_dir(n) / "hf")
        if bounded:
            if n > 1:              # the eval watcher has scored the previous checkpoint
                run.eval_dir(n - 1).mkdir(parents=True, exist_ok=True)
                (run.eval_dir(n - 1) / "summary.json").write_text("{}")
            apply_retention(run, keep_last=keep_last, keep_exports="until_evaluated")
    return du(run.checkpoints_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="checkpoint_bench.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, default=20)
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--keep-last", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=ROOT / ".cache" / "checkpoint-bench")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if min(args.rollouts, args.save_every, args.keep_last) < 1:
        ap.error("--rollouts, --save-every and --keep-last must be at least 1")
    import torch

    from agentrl.train.torch_backend import TorchPolicy

    args.dir.mkdir(parents=True, exist_ok=True)
    model_dir = bench_model(args.dir, FULL.train_model)
    policy = TorchPolicy(model_dir, train_config(model_dir, args.dir, FULL))
    for p in policy.module.parameters():      # one step, so that the optimizer holds its two moments
        p.grad = torch.zeros_like(p)
    policy.optimizer.step()
    with tempfile.TemporaryDirectory(prefix="checkpoint-bench-", dir=args.dir) as tmp:
        figure = run_side(Path(tmp) / "bounded", policy, args.rollouts, bounded=True, save_every=args.save_every,
                          keep_last=args.keep_last)
        baseline = run_side(Path(tmp) / "today", policy, args.rollouts, bounded=False, save_every=1, keep_last=1)
    out = {"rollouts": args.rollouts, "save_every": args.save_every, "keep_last": args.keep_last,
           "figure_bytes": figure, "baseline_bytes": baseline, "ratio": round(figure / baseline, 4)}
    if args.json:
        print(json.dumps(out))
        return 0
    mib = 2**20
    print(f"checkpoints/ after {args.rollouts} rollouts, weights published every rollout:\n"
          f"  figure:   {figure / mib:8.1f} MiB  (save_every {args.save_every}, keep_last {args.keep_last}, "
          f"exports until evaluated)\n"
          f"  baseline: {baseline / mib:8.1f} MiB  (a full checkpoint per rollout, none pruned)\n"
          f"  ratio {out['ratio']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
