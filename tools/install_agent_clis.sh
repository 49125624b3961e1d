#!/usr/bin/env bash
# Install the agent CLIs the harnesses drive, at the versions agentrl/harness/install.py pins (PINNED_CLIS:
# Claude Code, Qwen Code, Codex, OpenCode, Gemini CLI, from npm), into DIR (default: .agent-clis in the repo),
# mini-swe-agent (PyPI, pinned in agentrl/harness/mini_swe_agent.py, with a copy of this Python) into
# DIR/mini-swe-agent, and OpenHands' SDK (PyPI, pinned in agentrl/harness/openhands.py, with a copy of a
# Python 3.12 of this host: it says so and goes on without OpenHands where there is none) into DIR/openhands;
# then print the programs' paths. Skips npm and pip when DIR already runs exactly these versions; without
# npm or the registries it stops with their answer and exit 1. What the CLIs send and how to run them
# against the adapter: docs/agent-clis.md.
#
# The install itself is agentrl.commands.install_clis, the code the harnesses run when a tools directory
# lacks the CLIs, so the pins and the readiness check live in one place. It needs a Python that imports
# agentrl: the checkout's .venv (`make venv`), or AGENTRL_PYTHON.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${AGENTRL_PYTHON:-$root/.venv/bin/python}
[[ -x $python ]] || {
  echo "install_agent_clis: $python is missing: run \`make venv\`, or set AGENTRL_PYTHON to a Python with agentrl-hpc installed" >&2
  exit 1
}
exec "$python" -c 'import sys; from agentrl.commands.install_clis import main; sys.exit(main(sys.argv[1:]))' \
  "${1:-$root/.agent-clis}"
