"""`make clis` (tools/install_agent_clis.sh): the pinned agent CLIs, mini-swe-agent and OpenHands into a directory.

The install is the harnesses' own (agentrl.harness.install, agentrl.harness.python_tool), the code
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
    QWEN_BIN,
    clis_ready,
    npm_install,
    opencode_bin,
    pinned_cli_packages,
    place_atomically,
)
from ..harness.mini_swe_agent import TOOL as MINI
from ..harness.openhands import TOOL as OPENHANDS
from ..harness.python_tool import PYTHON


def main(argv: list[str] | None = None) -> int:
    """The pinned CLIs into DIR (an npm prefix), mini-swe-agent into DIR/mini-swe-agent and OpenHands into
    DIR/openhands, then the paths of the programs."""
    p = argparse.ArgumentParser(prog="install_agent_clis.sh", description=main.__doc__)
    p.add_argument("dir", metavar="DIR", type=Path, help="the install's own directory (an npm prefix)")
    dest = p.parse_args(argv).dir.resolve()
    python_tools = (MINI, OPENHANDS)

    def npm_keeping_python_tools(tmp: Path) -> None:
        npm_install(tmp, pinned_cli_packages(), dest)
        for tool in python_tools:       # a new CLI pin need not cost their builds
            if (dest / tool.dir).is_dir():
                (dest / tool.dir).rename(tmp / tool.dir)
    try:
        if not clis_ready(dest):
            place_atomically(dest, npm_keeping_python_tools, clis_ready)
        for tool in python_tools:
            try:
                tool.interpreter()
            except HarnessInstallError as e:    # OpenHands needs a Python 3.12 this host may lack: the rest stays
                print(f"install_agent_clis: not installing {tool.package}: {e}", file=sys.stderr)
                continue
            tool.install(dest)
    except HarnessInstallError as e:
        print(f"install_agent_clis: {e}", file=sys.stderr)
        return 1
    for program in (CLAUDE_BIN, QWEN_BIN, CODEX_BIN, opencode_bin(platform.machine()), GEMINI_ENTRY,
                    *(f"{tool.dir}/{PYTHON} {dest / tool.dir}/{tool.launcher}" for tool in python_tools
                      if (dest / tool.dir).is_dir())):
        print(dest / program)
    return 0
