"""`agentrl train RUN_DIR --config CONFIG`: the trainer role, one process per rank.

Under srun, mpirun or torchrun the ranks find each other through `hpc.launch.distenv` (gloo on
CPU, NCCL on GPU). The config is YAML whose `train:` section is a TrainConfig; relative paths in
it are relative to the config file.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import yaml


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="the run directory (created if missing)")
    p.add_argument("--config", type=Path, required=True, help="YAML with a train: section")


def load_config(path: Path):
    from .config import TrainConfigError, load_train_config

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TrainConfigError(f"{path}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("train"), dict):
        raise TrainConfigError(f"{path}: needs a `train:` mapping (see docs/train.md)")
    train = dict(data["train"])
    for key in ("model", "prompt_data"):
        if isinstance(train.get(key), str) and not os.path.isabs(train[key]):
            train[key] = str((path.parent / train[key]).resolve())
    return load_train_config(train, source=f"{path}: train"), data


def run(args: argparse.Namespace) -> int:
    from .config import TrainConfigError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    try:
        cfg, raw = load_config(args.config)
    except TrainConfigError as e:
        print(f"agentrl train: {e}", file=sys.stderr)
        return 2
    import torch

    from hpc.launch.distenv import detect, init_process_group
    from hpc.runlayout import RunLayout

    from .loop import Trainer
    from .torch_backend import barrier

    env = detect(os.environ)
    if env is not None and env.world_size > 1:
        init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = env.rank if env else 0
    if rank == 0 and not (args.run_dir / "run.yaml").exists():
        RunLayout.create(args.run_dir, config=raw)
    barrier()
    state = Trainer(RunLayout.open(args.run_dir), cfg).train()
    if rank == 0:
        print(f"trained {state.iteration} rollouts, {state.optimizer_steps} optimizer steps; "
              f"latest checkpoint {args.run_dir / 'checkpoints' / f'iter_{state.iteration}'}", flush=True)
    if env is not None and env.world_size > 1:
        torch.distributed.destroy_process_group()
    return 0
