"""`agentrl serve`: the inference role, one model server per task (hpc/inference/serve.py).

Under the launcher it reads the `inference:` section of $AGENTRL_RUN_DIR/run.yaml and serves as
inference-$AGENTRL_TASK_INDEX; by hand, `--config FILE --run-dir RUN` (RUN is created if missing).
Paths in the section are used as given. Exit status: 0 after SIGTERM, 1 if the server cannot start
or dies, 2 if the config cannot be served (the message names the field).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="YAML with an inference: section (default: the run's run.yaml)")
    p.add_argument("--run-dir", type=Path, help="the run directory (default: $AGENTRL_RUN_DIR)")


class _Unservable(Exception):
    pass


def _load(args: argparse.Namespace, run_dir: Path | None) -> tuple[Any, Path, str]:
    """(the inference section, the run directory, where the section came from)."""
    import yaml

    from hpc.records import RecordError
    from hpc.runlayout import RunDirError, RunLayout

    if run_dir is None:
        raise _Unservable("no run directory: pass --run-dir, or run under `agentrl launch` (AGENTRL_RUN_DIR)")
    try:
        if args.config is not None:
            config = yaml.safe_load(args.config.read_text())
            if not isinstance(config, dict):
                raise _Unservable(f"{args.config}: needs a mapping with an inference: section")
            exists = (run_dir / "run.yaml").exists()
            layout = RunLayout.open(run_dir) if exists else RunLayout.create(run_dir, config=config)
            source, base = f"{args.config}: inference", args.config.resolve().parent
        else:
            layout = RunLayout.open(run_dir)
            config, source = layout.manifest().config, f"{layout.manifest_path}: inference"
            base = layout.config_base()
    except (OSError, yaml.YAMLError, RecordError, RunDirError) as e:
        raise _Unservable(str(e)) from None
    if "inference" not in config:
        raise _Unservable(f"{source.rpartition(':')[0]} has no inference: section (see hpc/inference/serve.py)")
    section = config["inference"]
    if isinstance(section, dict) and isinstance(section.get("model"), str) and not Path(section["model"]).is_absolute():
        section = {**section, "model": str(base / section["model"])}      # relative to the config file
    return section, layout.root, source


def run(args: argparse.Namespace) -> int:
    from hpc.inference.serve import InferenceConfigError, role_env, serve

    try:
        env = role_env()
        section, run_root, source = _load(args, args.run_dir or env.run_dir)
        return serve(section, run_root, env, source)
    except (_Unservable, InferenceConfigError) as e:
        print(f"agentrl serve: {e}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agentrl serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
