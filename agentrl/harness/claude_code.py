"""Claude Code (Anthropic API), run as `claude -p` with stream-json output (docs/agent-clis.md, docs/harnesses.md)."""

from __future__ import annotations

import math
from pathlib import Path

from .base import (
    AgentCommand,
    HarnessRun,
    Trajectory,
    WireProtocol,
    argv_size_warnings,
    compact_trigger,
    compaction_warnings,
    with_overrides,
)
from .install import CLAUDE_BIN, install_clis
from .prompts import prompt_and_files
from .stream_json import read_stream_json

# Measured on 2.1.332 against a fake server (docs/harnesses.md): Claude Code compacts once the prompt
# reaches min(floor(E * pct / 100), E - 13000), where E = context window - min(max output, 20000).
OUTPUT_RESERVE_CAP = 20_000
AUTOCOMPACT_BUFFER = 13_000
MAX_OUTPUT_CAP = 128_000     # CLAUDE_CODE_MAX_OUTPUT_TOKENS above this is cut to it for an unknown model
WEB_TOOLS = ("WebSearch", "WebFetch")


def compaction(run: HarnessRun) -> tuple[str, int]:
    """CLAUDE_AUTOCOMPACT_PCT_OVERRIDE for the run's trigger, and the prompt size at which it fires."""
    effective = run.max_context - min(run.max_new_tokens, OUTPUT_RESERVE_CAP)
    # Rounded up, so that Claude Code's floor(E * pct / 100) lands on the trigger, not one token short.
    pct = min(100.0, math.ceil(1e6 * 100.0 * compact_trigger(run) / effective) / 1e6)
    text = f"{pct:.6f}".rstrip("0").rstrip(".")
    fires_at = max(0, min(math.floor(effective * float(text) / 100), effective - AUTOCOMPACT_BUFFER))
    return text, fires_at


class ClaudeCode:
    name = "claude_code"
    protocol: WireProtocol = "anthropic"

    def install(self, tools_dir: Path) -> None:
        install_clis(tools_dir)

    def command(self, run: HarnessRun) -> AgentCommand:
        prompt, files = prompt_and_files(run)
        pct, fires_at = compaction(run)
        argv = [f"{run.tools_dir}/clis/{CLAUDE_BIN}", "-p",
                "--disallowedTools", *WEB_TOOLS,   # enforced: the tools are gone from the request
                "--model", run.model, "--output-format", "stream-json", "--verbose",
                "--dangerously-skip-permissions"]
        env = {
            "HOME": run.home,
            "ANTHROPIC_BASE_URL": run.base_url,
            "ANTHROPIC_API_KEY": run.api_key,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",   # no /api/hello, telemetry or update checks
            "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",   # a system block that hashes the prompt: noise per episode
            "DISABLE_PROMPT_CACHING": "1",           # cache_control markers move between turns; we ignore them
            "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",  # ~2 kB of memory-writing instructions in every prompt
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(run.max_new_tokens),
            # An unknown model is taken to have 1M tokens of context: tell it the real window.
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(run.max_context),
            "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": pct,
        }
        if run.as_root:
            env["IS_SANDBOX"] = "1"   # else --dangerously-skip-permissions refuses to start as root
        argv, env = with_overrides(argv, env, run)
        # The prompt goes last, after `--`: a task text that starts with "-" must not read as a flag.
        argv += ["--", prompt]
        warnings = compaction_warnings(run, fires_at, "Claude Code") + argv_size_warnings(prompt)
        if run.max_new_tokens > MAX_OUTPUT_CAP:
            warnings.append(f"Claude Code caps max output tokens at {MAX_OUTPUT_CAP}, below max_new_tokens="
                            f"{run.max_new_tokens}")
        return AgentCommand(argv=argv, env=env, files=files, warnings=warnings)

    def read_trajectory(self, stdout: bytes, stderr: bytes) -> Trajectory:
        return read_stream_json(stdout)
