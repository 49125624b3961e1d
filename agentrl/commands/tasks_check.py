"""Each task's solution must pass (reward 1) and its untouched repository must fail (reward 0); tasks that
do not are flagged (exit 1). With --hacks, known reward hacks run as the agent and are graded as the pool
grades them: each must earn reward 0, and a hack that earns more is flagged (task, hack, mode, reward;
exit 1). With --leaks, each task's sandbox is searched for what its solution makes: a place that holds it is
flagged (task, file, place; exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpc.images.cache import ImageCache


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
    from ..swe import hacks, leaks
    from ..swe.check import CheckRow, Where, check_tasks, render_table
    from ..swe.harbor import HarborTaskError
    from ..swe.loaded import load_tasks

    if args.hack == ["list"]:
        print(hacks.describe())
        return 0
    if not args.paths:
        return usage_error("name the tasks: Harbor task directories, directories of them, or JSONL prompt files")
    if args.concurrency < 1:
        return usage_error("--concurrency must be at least 1")
    run_hacks = bool(args.hacks or args.hacks_only or args.hack)
    try:
        chosen = hacks.select(args.hack or []) if run_hacks else []
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    try:
        tasks = load_tasks(args.paths)
    except (HarborTaskError, ValueError, KeyError, FileNotFoundError) as e:
        print(f"cannot load the tasks: {e}", file=sys.stderr)
        return 2
    if not tasks:
        print("no tasks found in " + " ".join(args.paths), file=sys.stderr)
        return 2

    def say(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    def problem(row) -> str:
        return f"  <- {row.problem}" if row.problem else ""

    def progress(row: CheckRow) -> None:
        say(f"  {row.instance_id}: oracle {row.oracle_reward}, no-op {row.noop_reward}{problem(row)}")

    def hack_progress(row: hacks.HackRow) -> None:
        say(f"  {row.instance_id}: {row.hack} [{row.grading}] reward {row.reward}{problem(row)}")

    def leak_progress(row: leaks.LeakCheck) -> None:
        say(f"  {row.instance_id}: searched for its solution, {len(row.leaks)} place(s) hold it{problem(row)}")
    where = Where(args.runtime, ImageCache(Path(args.image_cache)) if args.image_cache else None, args.scratch)
    rows = [] if args.hacks_only else asyncio.run(check_tasks(tasks, args.concurrency, where, progress))
    hack_rows = asyncio.run(hacks.check_hacks(tasks, chosen, args.grading, args.concurrency, where, hack_progress)) \
        if run_hacks else None
    leak_rows = asyncio.run(leaks.check_leaks(tasks, args.concurrency, where, leak_progress)) if args.leaks else None
    if rows:
        print(render_table(rows))
    if hack_rows is not None:
        print(hacks.render_table(hack_rows))
    if leak_rows is not None:
        print(leaks.render_table(leak_rows))
    if args.json:
        print(rows_json(rows, hack_rows, leak_rows))
    flagged = [*(r.flagged for r in rows), *(r.flagged for r in hack_rows or []), *(r.flagged for r in leak_rows or [])]
    return 1 if any(flagged) else 0


def rows_json(rows: list, hack_rows: list | None = None, leak_rows: list | None = None) -> str:
    """One JSON object: the tasks' rows, with --hacks the hack runs' rows, with --leaks each task's search;
    `flagged` counts them all."""
    out: dict[str, Any] = {"tasks": [asdict(r) for r in rows]}
    if hack_rows is not None:
        out["hacks"] = [asdict(r) for r in hack_rows]
    if leak_rows is not None:
        out["leaks"] = [asdict(r) for r in leak_rows]
    out["flagged"] = sum(r.flagged for r in rows) + sum(r.flagged for r in (*(hack_rows or []), *(leak_rows or [])))
    return json.dumps(out)


def usage_error(message: str) -> int:
    """What argparse's parser.error does (usage on stderr, exit 2), for a check argparse cannot express."""
    print(f"agentrl tasks check: error: {message}", file=sys.stderr)
    return 2
