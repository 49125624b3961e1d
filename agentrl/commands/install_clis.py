"""`make clis` (tools/install_agent_clis.sh): the pinned agent CLIs and mini-swe-agent into a directory.

The install is the harnesses' own (agentrl.harness.install, agentrl.harness.mini_swe_agent), the code
they run when a tools directory lacks the CLIs: the pins and the readiness checks live in one place.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

from ..harness.base import HarnessInstallError
from ..harness.install import (
    CLAUDE_BIN,
    CODEX_BIN,
    GEMINI_ENTRY,
    MINI_DIR,
    QWEN_BIN,
    clis_ready,
    npm_install,
    opencode_bin,
    pinned_cli_packages,
    place_atomically,
)
from ..harness.mini_swe_agent import LAUNCHER, PYTHON, build, mini_ready, refresh_mini


def main(argv: list[str] | None = None) -> int:
    """The pinned CLIs into DIR (an npm prefix) and mini-swe-agent into DIR/mini-swe-agent, then the paths
    of the programs."""
    p = argparse.ArgumentParser(prog="install_agent_clis.sh", description=main.__doc__)
    p.add_argument("dir", metavar="DIR", type=Path, help="the install's own directory (an npm prefix)")
    dest = p.parse_args(argv).dir.resolve()
    mini = dest / MINI_DIR

    def npm_keeping_mini(tmp: Path) -> None:
        npm_install(tmp, pinned_cli_packages(), dest)
        if mini.is_dir():           # a new CLI pin need not cost mini-swe-agent's build
            mini.rename(tmp / MINI_DIR)
    try:
        if not clis_ready(dest):
            place_atomically(dest, npm_keeping_mini, clis_ready)
        if not refresh_mini(mini):
            place_atomically(mini, lambda tmp: build(tmp, mini), mini_ready)
    except HarnessInstallError as e:
        print(f"install_agent_clis: {e}", file=sys.stderr)
        return 1
    for program in (CLAUDE_BIN, QWEN_BIN, CODEX_BIN, opencode_bin(platform.machine()), GEMINI_ENTRY,
                    f"{MINI_DIR}/{PYTHON} {mini}/{LAUNCHER}"):
        print(dest / program)
    return 0
