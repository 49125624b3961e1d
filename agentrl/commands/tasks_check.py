"""Each task's solution must pass (reward 1) and its untouched repository must fail (reward 0); tasks that
do not are flagged (exit 1). With --hacks, known reward hacks run as the agent and are graded as the pool
grades them: each must earn reward 0, and a hack that earns more is flagged (task, hack, mode, reward;
exit 1). With --leaks, each task's sandbox is searched for what its solution makes: a place that holds it is
flagged (task, file, place; exit 1).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", help="Harbor task directories, directories of them, or JSONL prompt files")
    p.add_argument("--concurrency", type=int, default=2, help="tasks checked at once (default 2)")
    p.add_argument("--scratch", help="node-local directory for sandbox layers (default: the temp dir)")
    p.add_argument("--runtime", choices=("bwrap", "apptainer"), default="bwrap", help="sandbox runtime (default bwrap)")
    p.add_argument("--image-cache", metavar="DIR",
                   help="the image cache where tasks' images were built (`agentrl images build`)")
    p.add_argument("--json", action="store_true", help="end with one JSON object of the results")
    p.add_argument("--hacks", action="store_true",
                   help="also run the default set of known reward hacks against each task's grader")
    p.add_argument("--hacks-only", action="store_true", help="run the hacks but not the oracle and no-op")
    p.add_argument("--hack", action="append", metavar="NAME",
                   help="run this hack (repeatable; implies --hacks; `--hack list` names them all)")
    p.add_argument("--leaks", action="store_true",
                   help="also search each task's sandbox, as its agent finds it, for the solution (git objects "
                        "reachable or not, installed copies, caches, backups); a task whose answer is there is "
                        "flagged")
    p.add_argument("--grading", choices=("same", "isolated", "both"), default="both",
                   help="how hack runs are graded: in the agent's sandbox, with the patch in a fresh one, or "
                        "both (default)")


def run(args: argparse.Namespace) -> int:
    from ..swe.check import main as check_main

    if args.hack == ["list"]:
        from ..swe.hacks import describe
        print(describe())
        return 0
    if not args.paths:
        return usage_error("name the tasks: Harbor task directories, directories of them, or JSONL prompt files")
    if args.concurrency < 1:
        return usage_error("--concurrency must be at least 1")
    return check_main(args)


def usage_error(message: str) -> int:
    """What argparse's parser.error does (usage on stderr, exit 2), for a check argparse cannot express."""
    print(f"agentrl tasks check: error: {message}", file=sys.stderr)
    return 2
