"""A demo-sized GRPO run through one harness on the local Slurm cluster, and what its samples say.

configs/tiny-local.yaml with the pool's harness replaced (--harness), submitted with `agentrl launch
--executor sbatch` to the local cluster (`agentrl cluster up`): the CPU stand-in serving the tiny model,
the pool running the real CLI in bwrap sandboxes through the adapter, the torch trainer. Shrunk to
--rollouts rollouts of 2 tasks x 2 attempts, with a context wide enough for the CLI's own prompt
(--max-context). When the run has finished, every rollout's samples are checked against what sampled them
(agentrl/report/fidelity.py, as the learning bench does): attempts, samples per clean attempt, trained
tokens and the share whose recorded log-prob is the sampling weights' own, turns trained twice, rewards
off their grade, mask positions off their trace.

The demo's model is the tiny model untrained: its replies are mostly text without a tool call, so most
sessions are one turn, and the rewards 0. This shows the path (pool, sandbox, CLI, adapter, buffer,
trainer) on Slurm and its fidelity, not learning.

    python -m benchmarks.harness_run_bench --harness opencode [--rollouts 1] [--max-context 65536] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import tempfile

import yaml

from agentrl.harness import HARNESSES
from agentrl.models.tiny import make_tiny_model
from agentrl.report.fidelity import check_run
from benchmarks.shared_fs_bench import launch_and_wait, place_demo

RUN_TIMEOUT_S = 1800


def configure(config: Path, *, harness: str, rollouts: int, max_context: int) -> None:
    cfg = yaml.safe_load(config.read_text())
    cfg["pool"]["harness"] = harness
    cfg["pool"]["adapter"]["max_context"] = max_context
    cfg["train"].update(num_rollouts=rollouts, rollout_batch_size=2, n_samples_per_prompt=2,
                        max_tokens_per_gpu=max_context, rollout_timeout_s=900)
    cfg["launch"]["time_limit_min"] = 60
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--harness", required=True, choices=sorted(HARNESSES))
    ap.add_argument("--rollouts", type=int, default=1)
    ap.add_argument("--max-context", type=int, default=65536)
    ap.add_argument("--work", type=Path, help="keep the run here (default: a temp dir, removed)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="harness-run-") as tmp:
        where = args.work or Path(tmp)
        model = where / "model"
        make_tiny_model(model)
        config = place_demo(where / "demo", model)
        configure(config, harness=args.harness, rollouts=args.rollouts, max_context=args.max_context)
        run_dir = where / "demo/runs/demo"
        wall = launch_and_wait(config, run_dir, RUN_TIMEOUT_S)
        rollouts = [r.to_json() for r in check_run(run_dir, model)]
    if args.json:
        print(json.dumps({"harness": args.harness, "wall_s": wall, "rollouts": rollouts}, indent=1))
        return 0
    print(f"{args.harness}: the run finished on the local cluster in {wall:.0f} s")
    for r in rollouts:
        share = "n/a" if r["match_share"] is None else f"{100 * r['match_share']:.1f}%"
        print(f"  rollout {r['rollout']}: {r['attempts']} attempts, {r['samples']} samples "
              f"(per clean attempt {r['samples_per_clean_attempt']}), {r['trained_tokens']} trained tokens, "
              f"{share} of {r['checked_tokens']} checked the sampled ones; trained twice {r['twice_trained']}, "
              f"rewards off {r['reward_mismatches']}, masks off {r['mask_mismatches']}; "
              f"adapter {r['adapter_ms_per_turn'] or 0:.1f} ms a turn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
