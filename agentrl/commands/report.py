"""`agentrl report RUN [--out DIR] [--control RUN2]`: a run's progress as DIR/report.md beside its PNG plots.

Reads RUN/run.yaml, RUN/metrics.jsonl (the trainer's line per rollout), RUN/eval/iter_<n>/summary.json
and RUN/checkpoints/latest, and changes none of them; DIR defaults to RUN. Run it again at any time:
it rewrites the report from what the run holds now. Lines and files it cannot use are counted in the
report, and plots without data are listed with the reason. Exit 2: RUN is not a run directory.
With --control, the report also sets RUN beside RUN2, the same run with its learning signal removed
(`train.control: shuffle_rewards`): both training rewards and both eval curves, and a table of them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpc.records import RecordError
from hpc.runlayout import RunDirError

from ..report.render import write_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN", help="the run directory")
    p.add_argument("--out", type=Path, metavar="DIR", help="where report.md and its PNGs go (default: RUN)")
    p.add_argument("--control", type=Path, metavar="RUN2",
                   help="the same run with train.control: shuffle_rewards, to set beside RUN")


def run(args: argparse.Namespace) -> int:
    try:
        path = write_report(args.run_dir, args.out, args.control)
    except (RunDirError, RecordError) as e:
        print(f"agentrl report: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"agentrl report: cannot write the report: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agentrl report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))
