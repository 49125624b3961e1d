"""Training-side figures. Only part (a) is written so far.

(a) schedule quality: seeded rollouts of SWE-like trajectory lengths, cut into steps of --attempts
    attempts (an attempt fans out into several samples one time in ten), each step packed into
    micro-batches for dp_size 2, 4 and 8 and max_tokens_per_gpu 65536 and 131072. Per step,
        ratio = largest micro-batch / max(largest sample, step tokens / micro-batches)
    which is at least 1, the largest micro-batch any packing into that many could have.
    figure:   the schedule as built (first-fit decreasing, split, then LPT merge where splitting runs out)
    baseline: the same schedule, its final merge done by joining the two smallest micro-batches
    Both columns show the mean and worst ratio over steps; "merged" is the share of steps whose
    micro-batch count could only be aligned to dp_size by merging, the only place the two differ.
    Length distributions (tokens, clipped to [256, 120000]):
        swe         lognormal, median 20k, sigma 0.8
        swe+failed  the same, with 30% short failed attempts (lognormal, median 2k)
        long        lognormal, median 60k, sigma 0.4 (long-horizon agents near the context limit)

    python benchmarks/train_bench.py [--parts a] [--steps 40] [--attempts 16] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.train.schedule import _merge_lpt, _merge_two_smallest, _schedule  # noqa: E402

PARTS = ("a",)  # (b) and (c) join here, each a function taking the parsed arguments and returning its figures
DP_SIZES = (2, 4, 8)
CAPS = (65_536, 131_072)
MIN_TOKENS, MAX_TOKENS = 256, 120_000
FAN_OUT_SHARE = 0.1
DISTRIBUTIONS = ("swe", "swe+failed", "long")


def sample_lengths(distribution: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if distribution == "swe":
        lengths = rng.lognormal(np.log(20_000), 0.8, n)
    elif distribution == "swe+failed":
        lengths = np.where(rng.random(n) < 0.3, rng.lognormal(np.log(2_000), 0.5, n),
                           rng.lognormal(np.log(20_000), 0.8, n))
    elif distribution == "long":
        lengths = rng.lognormal(np.log(60_000), 0.4, n)
    else:
        raise ValueError(f"unknown distribution {distribution!r}")
    return np.clip(lengths, MIN_TOKENS, MAX_TOKENS).astype(int)


def rollout_steps(distribution: str, steps: int, attempts: int, seed: int) -> list[list[int]]:
    """Each step's sample lengths: `attempts` attempts, a tenth of them fanned out into 2 to 5 samples."""
    rng = np.random.default_rng([seed, DISTRIBUTIONS.index(distribution)])
    out = []
    for _ in range(steps):
        fan_outs = np.where(rng.random(attempts) < FAN_OUT_SHARE, rng.integers(2, 6, attempts), 1)
        out.append(sample_lengths(distribution, int(fan_outs.sum()), rng).tolist())
    return out


def step_ratio(lengths: list[int], cap: int, dp_size: int, merge) -> tuple[float, bool]:
    merged = []

    def recording(units, lengths, k):
        merged.append(True)
        return merge(units, lengths, k)

    bins = _schedule(range(len(lengths)), lengths, cap, dp_size, recording)
    largest = max(sum(lengths[i] for i in b) for b in bins)
    return largest / max(max(lengths), sum(lengths) / len(bins)), bool(merged)


def schedule_quality(steps: int, attempts: int, seed: int) -> list[dict]:
    rows = []
    for distribution in DISTRIBUTIONS:
        rollout = rollout_steps(distribution, steps, attempts, seed)
        for dp_size in DP_SIZES:
            for cap in CAPS:
                lpt = [step_ratio(lengths, cap, dp_size, _merge_lpt) for lengths in rollout]
                naive = [step_ratio(lengths, cap, dp_size, _merge_two_smallest)[0] for lengths in rollout]
                ratios = [ratio for ratio, _ in lpt]
                rows.append({"distribution": distribution, "dp_size": dp_size, "max_tokens_per_gpu": cap,
                             "steps": steps, "merged_share": sum(m for _, m in lpt) / steps,
                             "lpt_mean": statistics.fmean(ratios), "lpt_worst": max(ratios),
                             "merge_two_smallest_mean": statistics.fmean(naive),
                             "merge_two_smallest_worst": max(naive)})
    return rows


def print_schedule_quality(rows: list[dict]) -> None:
    print(f"{'distribution':<12} {'dp':>3} {'cap':>7} {'merged':>7} {'LPT mean':>9} {'worst':>6} "
          f"{'2-smallest mean':>16} {'worst':>6}")
    for r in rows:
        print(f"{r['distribution']:<12} {r['dp_size']:>3} {r['max_tokens_per_gpu']:>7} {r['merged_share']:>7.0%} "
              f"{r['lpt_mean']:>9.3f} {r['lpt_worst']:>6.3f} {r['merge_two_smallest_mean']:>16.3f} "
              f"{r['merge_two_smallest_worst']:>6.3f}")
    print("ratio: largest micro-batch / max(largest sample, step tokens / micro-batches); 1 is the best possible")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="a", help=f"comma-separated parts to run, of {','.join(PARTS)}")
    ap.add_argument("--steps", type=int, default=40, help="steps per distribution in (a)")
    ap.add_argument("--attempts", type=int, default=16, help="attempts per step (global_batch_size) in (a)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="end with one JSON object of the figures")
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"unknown part {unknown[0]!r}: only {', '.join(PARTS)} is written so far")
    if args.steps < 1 or args.attempts < 1:
        ap.error("--steps and --attempts must be at least 1")

    # steps that cannot avoid micro-batches over the cap are what (a) measures; their warnings are noise here
    logging.getLogger("agentrl.train.schedule").setLevel(logging.ERROR)
    figures = {"benchmark": "train", "seed": args.seed}
    if "a" in parts:
        rows = schedule_quality(args.steps, args.attempts, args.seed)
        print_schedule_quality(rows)
        figures["schedule"] = {"attempts_per_step": args.attempts, "results": rows}
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
