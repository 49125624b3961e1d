"""`agentrl eval`: score checkpoints without touching the training job.

    agentrl eval CHECKPOINT --tasks DATA [--out DIR] [--n N] [--seed S] [--config FILE]
    agentrl eval --watch RUN [--until-done]        (the eval role: RUN/run.yaml's eval: section)

CHECKPOINT is a checkpoint directory (checkpoints/iter_<n>, its hf/ export is served) or an HF
model directory. Results go to DIR (default: RUN/eval/iter_<n> for a run's checkpoint):
results.jsonl (one line per attempt) and summary.json (pass@1, pass@k, empty patches, infra
failures, timings, the config). Killed and started again, it finishes without redoing attempts.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, nargs="?", help="a checkpoint or HF model directory")
    p.add_argument("--watch", type=Path, metavar="RUN", nargs="?", const=Path(""),
                   help="score each checkpoint of RUN as it lands (default RUN: $AGENTRL_RUN_DIR, as a launched role)")
    p.add_argument("--until-done", action="store_true", help="--watch: stop once the run ended and all is scored")
    p.add_argument("--tasks", type=Path, help="prompt JSONL or Harbor task directories (default: the config's)")
    p.add_argument("--config", type=Path, help="YAML with an eval: section (default: the run's run.yaml)")
    p.add_argument("--out", type=Path, help="where results go (default: RUN/eval/iter_<n>)")
    p.add_argument("--n", type=int, help="attempts per task")
    p.add_argument("--seed", type=int, help="sampling seed")


def _config(args: argparse.Namespace, run_dir: Path | None):
    from ..run_config import RunConfigError, role_config

    keys = {"tasks": str(args.tasks.resolve()) if args.tasks is not None else None, "n_samples": args.n,
            "seed": args.seed}
    try:
        config = role_config(run_dir, args.config, overrides={"eval": {k: v for k, v in keys.items() if v is not None}})
    except RunConfigError as e:
        if args.tasks is None and "eval.tasks: Field required" in str(e):
            raise RunConfigError(f"{e}\nno eval tasks: give --tasks DATA, or eval.tasks in the config") from None
        raise
    return config.section("eval")


def run(args: argparse.Namespace) -> int:
    from hpc.records import RecordError
    from hpc.runlayout import EvalLayout, RunDirError, RunLayout

    from ..eval.score import CheckpointEval
    from ..eval.watch import training_ended, watch
    from ..swe.harbor import HarborTaskError
    from ..swe.loaded import load_tasks

    if args.watch == Path(""):
        from hpc.environment import RoleEnv

        args.watch = RoleEnv.from_environ().run_dir
        if args.watch is None:
            print("agentrl eval: --watch needs RUN (or AGENTRL_RUN_DIR, as a role of agentrl launch)",
                  file=sys.stderr)
            return 2
    if (args.checkpoint is None) == (args.watch is None):
        print("agentrl eval: give a CHECKPOINT, or --watch RUN", file=sys.stderr)
        return 2
    ckpt = args.checkpoint.resolve() if args.checkpoint else None
    run_dir = args.watch or (ckpt.parent.parent if ckpt and ckpt.parent.name == "checkpoints" else None)
    try:
        cfg = _config(args, run_dir)
        tasks = load_tasks([str(cfg.tasks)])
    except (RunDirError, RecordError, HarborTaskError, OSError, ValueError) as e:   # RunConfigError is one
        print(f"agentrl eval: {e}", file=sys.stderr)
        return 2
    if not tasks:
        print(f"agentrl eval: no tasks in {cfg.tasks}", file=sys.stderr)
        return 2

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if args.watch:
            layout = RunLayout.open(args.watch)
            done = await watch(layout, cfg, tasks, stop=stop, until=training_ended if args.until_done else None)
            print(f"agentrl eval: scored {len(done)} checkpoints: {', '.join(f'iter_{n}' for n in done) or '-'}")
            return 0
        assert ckpt is not None     # a CHECKPOINT, since not --watch (checked above)
        model = ckpt / "hf" if (ckpt / "hf" / "config.json").is_file() else ckpt
        match = re.fullmatch(r"iter_(\d+)", ckpt.name)
        n = int(match.group(1)) if match else 0
        out = args.out or (RunLayout.open(run_dir).eval_dir(n) if run_dir else Path("eval") / ckpt.name)
        summary = await CheckpointEval(out, cfg, tasks, n).run(model)
        print(f"agentrl eval: {len(tasks)} tasks x {cfg.n_samples}: pass@1 {summary['pass@1']}, "
              f"pass@{summary['k']} {summary['pass@k']}; {EvalLayout(out).summary_path}")
        return 0
    try:
        return asyncio.run(main())
    except (RunDirError, RecordError, ValueError) as e:
        print(f"agentrl eval: {e}", file=sys.stderr)
        return 1
