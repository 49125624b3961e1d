"""`agentrl serve`: the inference role, one model server per task (hpc/inference/serve.py).

Under the launcher it reads the `inference:` section of $AGENTRL_RUN_DIR/run.yaml and serves as
inference-$AGENTRL_TASK_INDEX; by hand, `--config FILE --run-dir RUN` (RUN is created if missing).
Relative paths are relative to the config file (agentrl/run_config.py). Exit status: 0 after
SIGTERM, 1 if the server cannot start or dies, 2 if the config cannot be served (naming the field).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="YAML with an inference: section (default: the run's run.yaml)")
    p.add_argument("--run-dir", type=Path, help="the run directory (default: $AGENTRL_RUN_DIR)")


def run(args: argparse.Namespace) -> int:
    from hpc.inference.serve import InferenceConfigError, serve
    from hpc.records import RecordError
    from hpc.runlayout import RunDirError, RunLayout

    from ..run_config import RunConfigError, role_context

    try:
        ctx = role_context(args.run_dir, args.config, how="--run-dir")
        section = ctx.config.section("inference")
        layout = RunLayout.open(ctx.run_dir) if RunLayout.holds_run(ctx.run_dir) else \
            RunLayout.create(ctx.run_dir, config=ctx.config.raw)
        return serve(section, layout.root, ctx.env, f"{ctx.config.source}: inference")
    except (RunConfigError, InferenceConfigError, RunDirError, RecordError) as e:
        print(f"agentrl serve: {e}", file=sys.stderr)
        return 2
