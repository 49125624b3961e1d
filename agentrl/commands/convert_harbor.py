"""`agentrl convert harbor TASK_DIR... --out FILE.jsonl`: Harbor task directories -> JSONL prompt data.

A Harbor task is a directory: instruction.md (the prompt), task.toml (timeouts, resources, image),
environment/ (Dockerfile or a prebuilt image named in task.toml), tests/test.sh (+ config.json and
helpers) and solution/solve.sh. The prompt and the verifier files travel byte for byte; the output is
reproducible (agentrl/swe/harbor.py). A task directory is untrusted input, read through TaskTree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..swe.harbor import write_prompts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("task_dirs", nargs="+", metavar="TASK_DIR",
                   help="Harbor task directories, or directories of them (a dataset)")
    p.add_argument("--out", required=True, metavar="FILE.jsonl", help="output file, written atomically")
    p.add_argument("--on-error", choices=["skip", "fail"], default="fail",
                   help="a malformed task: skip it (reported on stderr) or write nothing (default)")


def run(args: argparse.Namespace) -> int:
    """Exit 0 when a file was written with at least one task, 1 otherwise."""
    try:
        result = write_prompts(args.task_dirs, Path(args.out), args.on_error)
    except OSError as e:
        print(f"{args.out}: cannot write ({e.strerror})", file=sys.stderr)
        return 1
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for error in result.errors:
        print(f"{'skipped' if args.on_error == 'skip' else 'error'}: {error}", file=sys.stderr)
    if result.errors and args.on_error == "fail":
        print(f"{len(result.errors)} malformed task(s); {args.out} not written", file=sys.stderr)
        return 1
    print(f"{args.out}: {len(result.records)} task(s), {len(result.errors)} skipped", file=sys.stderr)
    return 0 if result.records else 1
