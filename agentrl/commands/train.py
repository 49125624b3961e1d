"""`agentrl train [RUN_DIR] [--config CONFIG]`: the trainer role, one process per rank.

Under srun, mpirun or torchrun the ranks find each other through `hpc.launch.distenv` (gloo on
CPU, NCCL on GPU). The config is YAML whose `train:` section is a TrainConfig; relative paths in
it are relative to the config file. Started by `agentrl launch`, both come from the run: the
directory from AGENTRL_RUN_DIR and the config from its run.yaml (relative paths: to the launched
config file's directory).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, nargs="?",
                   help="the run directory (created if missing; default: $AGENTRL_RUN_DIR, set by agentrl launch)")
    p.add_argument("--config", type=Path, help="YAML with a train: section (default: the run's run.yaml)")


def run(args: argparse.Namespace) -> int:
    from hpc.records import RecordError
    from hpc.runlayout import RunDirError, RunLayout

    from ..run_config import RunConfigError, role_context

    try:
        ctx = role_context(args.run_dir, args.config)
        cfg = ctx.config.section("train")
    except (RunConfigError, RunDirError, RecordError) as e:
        print(f"agentrl train: {e}", file=sys.stderr)
        return 2
    run_dir = ctx.run_dir

    import torch

    from hpc.launch.distenv import detect, init_process_group

    from ..train.loop import Trainer
    from ..train.torch_backend import barrier

    env = detect(os.environ)
    if env is not None and env.world_size > 1:
        init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = env.rank if env else 0
    if rank == 0 and not RunLayout.holds_run(run_dir):
        RunLayout.create(run_dir, config=ctx.config.raw)
    barrier()
    state = Trainer(RunLayout.open(run_dir), cfg, liveness_file=ctx.env.heartbeat_file).train()
    if rank == 0:
        print(f"trained {state.iteration} rollouts, {state.optimizer_steps} optimizer steps; "
              f"latest checkpoint {RunLayout(run_dir).checkpoint_dir(state.iteration)}", flush=True)
    if env is not None and env.world_size > 1:
        torch.distributed.destroy_process_group()
    return 0
