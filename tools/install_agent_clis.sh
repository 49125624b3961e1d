#!/usr/bin/env bash
# Install the agent CLIs the harnesses drive, at pinned versions, into DIR (default: .agent-clis in the repo),
# and print the paths of the two binaries. Skips npm when DIR already runs exactly these versions.
# What the CLIs send and how to run them against the adapter: docs/agent-clis.md.
set -euo pipefail

CLAUDE_CODE_VERSION=2.1.332
QWEN_CODE_VERSION=0.24.4

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$root/.agent-clis}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
claude=$dir/node_modules/.bin/claude
qwen=$dir/node_modules/.bin/qwen

# Ask the binaries rather than package.json: a blocked postinstall leaves Claude Code's package.json
# in place with a stub instead of the native binary.
installed() {
  [[ -x $claude && -x $qwen ]] &&
    [[ $("$claude" --version 2>/dev/null) == "$CLAUDE_CODE_VERSION (Claude Code)" ]] &&
    [[ $("$qwen" --version 2>/dev/null) == "$QWEN_CODE_VERSION" ]]
}

if ! installed; then
  command -v npm >/dev/null || { echo "install_agent_clis: npm is missing (install Node.js 20 or newer)" >&2; exit 1; }
  npm install --prefix "$dir" --no-audit --no-fund --save-exact --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@qwen-code/qwen-code@$QWEN_CODE_VERSION"
  installed || { echo "install_agent_clis: $dir does not run the pinned versions after npm install" >&2; exit 1; }
fi
echo "$claude"
echo "$qwen"
