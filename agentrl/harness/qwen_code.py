"""Qwen Code (OpenAI API), run headless with stream-json output (docs/agent-clis.md, docs/harnesses.md).

Qwen Code is a Node.js program: it runs on the tools directory's own node, so images without Node work.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .base import (
    AgentCommand,
    HarnessRun,
    Trajectory,
    WireProtocol,
    argv_size_warnings,
    compaction_warnings,
    with_overrides,
)
from .install import NODE_BIN, QWEN_ENTRY, install_clis, install_node
from .prompts import prompt_and_files
from .stream_json import read_stream_json

# From Qwen Code 0.24.4's chatCompressionService and tokenLimits (docs/harnesses.md): compaction fires at
# min(pct * window, window - 20000 - 13000) (the cap only where it is positive), and every request's
# max_tokens is clamped to window - prompt - max(10000, 5% of window), but not below 4000.
SUMMARY_RESERVE = 20_000
AUTOCOMPACT_BUFFER = 13_000
CLAMP_MARGIN_MIN = 10_000
# Tools whose calls leave the sandbox. `--exclude-tools` removes them from the registry (web_fetch is
# otherwise reachable through the tool_search/tool_call bridge even though it is not sent eagerly).
WEB_TOOLS = ("web_fetch", "web_search")


def fires_at(run: HarnessRun) -> int:
    proportional = run.compact_at * run.max_context
    ceiling = run.max_context - SUMMARY_RESERVE - AUTOCOMPACT_BUFFER
    return math.floor(min(proportional, ceiling) if ceiling > 0 else proportional)


def output_clamp_start(run: HarnessRun) -> int:
    """The prompt size from which Qwen Code sends less than max_new_tokens."""
    margin = max(CLAMP_MARGIN_MIN, round(0.05 * run.max_context))
    return run.max_context - margin - run.max_new_tokens


def settings(run: HarnessRun) -> dict:
    return {
        # Managed memory sends an extraction request after every answer; auto-skill a review after
        # tool-heavy sessions: requests the rollout never asked for.
        "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False, "enableAutoSkill": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False},
        # In settings, not as --auth-type: Qwen Code crashes on a repeated --auth-type (or --model), so
        # the command line holds no default that extra_args could want to repeat.
        "security": {"auth": {"selectedType": "openai"}},
        "context": {"autoCompactThreshold": run.compact_at},
        # An unknown model is assumed to have 200k tokens: the compaction trigger is a fraction of this.
        "model": {"generationConfig": {"contextWindowSize": run.max_context}},
    }


class QwenCode:
    name = "qwen_code"
    protocol: WireProtocol = "openai"

    def install(self, tools_dir: Path) -> None:
        install_clis(tools_dir)
        install_node(tools_dir)

    def command(self, run: HarnessRun) -> AgentCommand:
        prompt, files = prompt_and_files(run)
        files[f"{run.home}/.qwen/settings.json"] = json.dumps(settings(run), indent=1).encode()
        argv = [f"{run.tools_dir}/{NODE_BIN}", f"{run.tools_dir}/clis/{QWEN_ENTRY}",
                "--exclude-tools", *WEB_TOOLS, "--yolo", "--output-format", "stream-json"]
        env = {
            "HOME": run.home,   # must exist: a missing HOME crashes Qwen Code (the settings file creates it)
            "OPENAI_BASE_URL": f"{run.base_url}/v1",
            "OPENAI_API_KEY": run.api_key,
            "OPENAI_MODEL": run.model,   # env, not --model: a --model in extra_args then wins instead of crashing
            "QWEN_CODE_MAX_OUTPUT_TOKENS": str(run.max_new_tokens),
        }
        argv, env = with_overrides(argv, env, run)
        # `--prompt=` keeps a task text that starts with "-" a value, and no array flag can swallow it.
        argv.append(f"--prompt={prompt}")
        trigger = fires_at(run)
        warnings = compaction_warnings(run, trigger, "Qwen Code") + argv_size_warnings(prompt)
        if trigger > output_clamp_start(run):
            warnings.append(f"Qwen Code cuts max_tokens below max_new_tokens once the prompt passes "
                            f"{output_clamp_start(run)} tokens, before compaction at {trigger}")
        return AgentCommand(argv=argv, env=env, files=files, warnings=warnings)

    def read_trajectory(self, stdout: bytes, stderr: bytes) -> Trajectory:
        return read_stream_json(stdout)
