"""`agentrl pool [RUN_DIR] [--config CONFIG]`: the rollout pool role, one worker per CPU node.

As a role of `agentrl launch` the run directory comes from AGENTRL_RUN_DIR, the config from the
run's run.yaml (its `pool:` section, and from `train:` the model's tokenizer and the prompt data:
which row each group is comes from the trainer, in the ledger), and the worker's index from
AGENTRL_TASK_INDEX. SIGTERM stops claiming and lets running attempts finish. Exit 2: the config is
wrong, or this pool's prompt data or temperature is not the trainer's.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, nargs="?", help="the run directory (default: $AGENTRL_RUN_DIR)")
    p.add_argument("--config", type=Path, help="YAML with pool: and train: sections (default: the run's run.yaml)")
    p.add_argument("--max-attempts", type=int, help="stop after this many attempts (tests, smoke runs)")


def run(args: argparse.Namespace) -> int:
    from hpc.records import RecordError
    from hpc.runlayout import RunDirError, RunLayout

    from ..pool.config import PoolConfig, PoolConfigError
    from ..pool.worker import PoolWorker
    from ..prompts.groups import RolloutGroupsError
    from ..run_config import RunConfigError, role_context

    try:
        ctx = role_context(args.run_dir, args.config)
        layout = RunLayout.open(ctx.run_dir)
        train, pool = ctx.config.section("train"), ctx.config.pool or PoolConfig()   # every pool key has a default
    except (RunConfigError, RunDirError, RecordError, OSError) as e:
        print(f"agentrl pool: {e}", file=sys.stderr)
        return 2
    worker = PoolWorker(layout, pool, train.model, train.prompt_data, index=ctx.env.task_index,
                        liveness_file=ctx.env.heartbeat_file)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        counts = await worker.serve(stop, max_attempts=args.max_attempts)
        print("agentrl pool: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    try:
        asyncio.run(main())
    except (RolloutGroupsError, PoolConfigError) as e:     # this pool cannot do the trainer's rollouts
        print(f"agentrl pool: {e}", file=sys.stderr)
        return 2
    return 0
