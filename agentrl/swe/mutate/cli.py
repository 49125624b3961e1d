"""`agentrl tasks generate mutations`: the arguments checked, the run reported (the work is build.py's)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from hpc.sandbox.base import SandboxError

from ..families.base import GenerationError
from ..generate import Refused
from .build import generate, options


def run(args: argparse.Namespace, t0: float) -> int:
    """Exit 0 with every task written; 2 for arguments or an output refused; 1 when a source cannot make them."""
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
    try:
        written = generate(options(args), say)
    except Refused as e:
        say(str(e))
        return 2
    except (GenerationError, SandboxError, OSError, subprocess.SubprocessError) as e:
        say(f"generate mutations: {e}")
        return 1
    say(f"{args.out}: {len(written)} mutations task(s), split {args.split}, seed {args.seed}, "
        f"in {time.monotonic() - t0:.1f} s")
    return 0
