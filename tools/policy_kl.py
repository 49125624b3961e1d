"""How far checkpoints moved from a start model, on the tokens one rollout of a run trained.

    python tools/policy_kl.py RUN_DIR START_MODEL CHECKPOINT_HF... [--rollout 0] [--samples 120]

For each checkpoint (an `hf` export), on the trained tokens of the rollout's first samples: the mean
|log-prob change|, the share of tokens whose log-prob moved more than 0.5, and the k3 estimate of
KL(policy || start) that `train.kl_coef` multiplies, reduced as the loss reduces it (the mean over a
sample's trained tokens, then over samples). Why: a KL penalty to the warm start holds a run back in
proportion to this figure, so comparing it between a GRPO run and its control says whether the penalty
would restrain the control more than it restrains learning (docs/learning.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def distance(start: list[np.ndarray], moved: list[np.ndarray]) -> dict[str, float]:
    """The figures from per-sample log-probs of the same trained tokens under the start model and a
    checkpoint."""
    if len(start) != len(moved) or any(a.shape != b.shape for a, b in zip(start, moved, strict=True)):
        raise ValueError("start and moved must hold the same samples' tokens")
    kept = [(a, b) for a, b in zip(start, moved, strict=True) if len(a)]
    if not kept:
        raise ValueError("no trained tokens to compare")
    change = np.concatenate([b - a for a, b in kept])
    k3 = [np.mean(np.exp(a - b) - (a - b) - 1) for a, b in kept]    # per token: exp(ref - lp) - (ref - lp) - 1
    return {"tokens": float(len(change)), "mean_abs_change": float(np.abs(change).mean()),
            "moved_over_half": float(np.mean(np.abs(change) > 0.5)), "kl_k3": float(np.mean(k3))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a run directory whose rollout's samples give the tokens")
    p.add_argument("start", type=Path, help="the start model (the warm start's directory)")
    p.add_argument("checkpoints", type=Path, nargs="+", help="checkpoint exports (RUN/checkpoints/iter_N/hf)")
    p.add_argument("--rollout", type=int, default=0)
    p.add_argument("--samples", type=int, default=120, help="the rollout's first samples (default 120)")
    args = p.parse_args(argv)
    for path in (args.start, *args.checkpoints):
        if not (path / "config.json").is_file():
            p.error(f"{path} is not a model directory (no config.json): give an hf export or the warm start")
    from transformers import AutoModelForCausalLM

    from agentrl.report.fidelity import token_log_probs
    from agentrl.sample import SAMPLE_CODEC
    from hpc.buffer import read_rollout
    from hpc.ledger import Ledger
    from hpc.runlayout import RunLayout

    run = RunLayout(args.run)
    groups = read_rollout(Ledger(run.ledger_dir), run.buffer_dir, args.rollout, SAMPLE_CODEC)
    samples = [s for g in groups.values() for s in g][:args.samples]
    if not samples:
        p.error(f"{args.run} holds no samples of rollout {args.rollout}")

    def trained(path: Path) -> list[np.ndarray]:
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        return [token_log_probs(model, s.tokens)[len(s.tokens) - s.response_length:][s.loss_mask.astype(bool)]
                for s in samples]
    start = trained(args.start)
    for path in args.checkpoints:
        d = distance(start, trained(path))
        print(f"{path}: {d['tokens']:.0f} tokens, mean |change| {d['mean_abs_change']:.4f}, "
              f"moved > 0.5: {100 * d['moved_over_half']:.2f}%, KL k3 {d['kl_k3']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
