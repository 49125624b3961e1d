"""`agentrl tasks generate FAMILY --n N --seed S --split train|heldout --out DIR`: Harbor tasks made procedurally.

A family (agentrl/swe/families/) draws a buggy repository, its fix and hidden tests from a seed: the same
(family, split, seed, n) gives the same bytes, and train and heldout never hold the same task
(agentrl/swe/generate.py). The mutations family puts bugs into the projects named by --source, each
validated by the project's own tests (agentrl/swe/mutate/, docs/tasks.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from hpc.sandbox.base import SandboxError

from ..swe.families import FAMILIES, GenerationError
from ..swe.generate import HINTS, HOST_PYTHON, Refused, generate
from ..swe.mutate import commits_build
from ..swe.mutate.build import Options
from ..swe.mutate.build import generate as build_mutations

# The families made from real projects, validated by their own tests (agentrl/swe/mutate/)
BUILDERS = {"mutations": build_mutations, "commits": commits_build.generate}


class WithRequirement(argparse.Action):
    """--with REQ belongs to the --source before it: kept as (that source's index, REQ)."""

    def __call__(self, parser, namespace, values, option_string=None):
        sources = getattr(namespace, "source", None) or []
        if not sources:
            parser.error(f"{option_string} {values}: give it after the --source whose tests need it")
        setattr(namespace, self.dest, [*getattr(namespace, self.dest), (len(sources) - 1, values)])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("family", help=f"the task family: {', '.join(sorted(FAMILIES))}; mutations (bugs put into "
                                  "the projects named by --source, validated by their own tests) or commits (fixes "
                                  "from the history of the git checkouts named by --source): docs/tasks.md")
    p.add_argument("--n", type=int, required=True, help="how many tasks")
    p.add_argument("--seed", type=int, default=0, help="the set's seed (default 0)")
    p.add_argument("--split", required=True, help="train or heldout: disjoint task sets, whatever the seeds")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="writes DIR/<family>-<split>-<index>/")
    p.add_argument("--force", action="store_true", help="replace task directories that already exist")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="tasks checked at once on the host (default: the CPU count)")
    m = p.add_argument_group("mutations and commits")
    m.add_argument("--source", action="append", metavar="SPEC",
                   help="a project: a checkout directory, an sdist .tar.gz, or a requirement pip downloads "
                        "(repeatable); for commits, a git checkout with its history")
    m.add_argument("--with", dest="with_", action=WithRequirement, default=[], metavar="REQ",
                   help="a requirement the previous --source's tests need (pytest, hypothesis==6.*; repeatable): its "
                        "wheels go into an image its tasks share, built by `agentrl images build` (docs/tasks.md)")
    m.add_argument("--base-image", default=None, metavar="REF",
                   help="what the image of a source with --with is built FROM (default python:3.11-slim)")
    m.add_argument("--image-cache", type=Path, metavar="DIR",
                   help="the image cache where that image is found (`agentrl images build ... --cache DIR`)")
    m.add_argument("--hints", nargs="?", const="location", choices=HINTS, default=None,
                   help="what the instruction tells of the bug: location (the default of a bare --hints), its file "
                        "and function; fix, also its line and the sed command that makes the fix, as the pyfix-hint "
                        "family's (for the scripted teacher and the learning bench; only one-line fixes qualify). "
                        "For commits: the files the fix changes, and with fix the commit's patch")
    m.add_argument("--clean-runs", type=int, default=3, help="runs of the clean tree, to find flaky tests (default 3)")
    m.add_argument("--test-timeout", type=float, default=20.0,
                   help="seconds one run of a project's suite may take; a mutant past it is refused (default 20)")
    m.add_argument("--find-links", type=Path, metavar="DIR", help="pip takes requirements' sdists from DIR alone")
    m.add_argument("--scratch", help="node-local directory for the validation sandboxes (default: the temp dir)")
    m.add_argument("--slurm", action="store_true",
                   help="validate each batch of candidates as a Slurm job array (--out on a filesystem the nodes "
                        "share), and watch it")
    m.add_argument("--parallelism", type=int, default=8, help="with --slurm: array tasks at once (default 8)")
    m.add_argument("--sbatch-option", action="append", default=[], metavar="OPT",
                   help="with --slurm: an sbatch option for the arrays, such as --partition=cpu (repeatable)")
    p.add_argument("--python", default=HOST_PYTHON, help="the interpreter the tasks' tests are checked with (default "
                                                        f"{HOST_PYTHON}: what a host task's sandbox runs)")


def run(args: argparse.Namespace) -> int:
    """Exit 0 with every task written; 2 for arguments or an output refused; 1 when a task fails its check."""
    t0 = time.monotonic()
    if args.family in BUILDERS:
        return run_mutations(args, t0)
    if args.source or args.hints or args.slurm or args.with_ or args.base_image or args.image_cache:
        print(f"--source, --with, --base-image, --image-cache, --hints and --slurm are the mutations and commits "
              f"families', not {args.family!r}'s", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"--jobs must be at least 1, got {args.jobs}", file=sys.stderr)
        return 2
    try:
        written = generate(args.family, args.split, args.seed, args.n, args.out, force=args.force, jobs=args.jobs,
                           python=args.python, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except Refused as e:
        print(e, file=sys.stderr)
        return 2
    except (GenerationError, OSError, subprocess.SubprocessError) as e:
        print(f"generate: {e}", file=sys.stderr)
        return 1
    print(f"{args.out}: {len(written)} {args.family} task(s), split {args.split}, seed {args.seed}, "
          f"in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


def run_mutations(args: argparse.Namespace, t0: float) -> int:
    """The mutations or commits family. Exit 0 with every task written; 2 for arguments or an output refused; 1
    when a source cannot make them."""
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
    try:
        written = BUILDERS[args.family](options(args), say)
    except Refused as e:
        say(str(e))
        return 2
    except (GenerationError, SandboxError, OSError, subprocess.SubprocessError) as e:
        say(f"generate {args.family}: {e}")
        return 1
    say(f"{args.out}: {len(written)} {args.family} task(s), split {args.split}, seed {args.seed}, "
        f"in {time.monotonic() - t0:.1f} s")
    return 0


def options(args: argparse.Namespace) -> Options:
    sources = tuple(args.source or ())
    given = args.with_
    requirements = tuple(tuple(r for i, r in given if i == k) for k in range(len(sources))) if given else ()
    return Options(sources, args.n, args.seed, args.split, Path(args.out), args.hints, args.force,
                   args.jobs, args.clean_runs, args.test_timeout, args.find_links, args.scratch, args.slurm,
                   args.parallelism, tuple(args.sbatch_option), requirements, args.base_image,
                   args.image_cache)
