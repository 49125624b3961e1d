"""OpenCode (sst/opencode, npm `opencode-ai`; OpenAI API through a custom provider), run headless:
`opencode run --format json` (docs/agent-clis.md, docs/harnesses.md).

The npm package is a launcher; the program is a Bun-compiled binary in a platform package (an
optionalDependency, from the npm registry like the rest). The harness runs that binary itself, so images
need no Node for it.

What keeps a session one clean chain of the adapter's trajectory tree:
- `--title`: without it OpenCode asks the model for the session's title, a request of its own beside the
  agent's (a second chain, measured: 2 chains for a 3-turn session, 1 with it).
- OPENCODE_DISABLE_PRUNE: pruning replaces old tool outputs in the history it sends, which would fork the
  chain at the first pruned output.
Everything else that would reach out is off: models.dev, updates, default plugins, LSP downloads, sharing;
and the task's own opencode.json and ~/.claude files are not read (the repository is the agent's, hostile).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from .base import (
    UNREADABLE,
    AgentCommand,
    HarnessRun,
    Trajectory,
    WireProtocol,
    argv_size_warnings,
    compaction_warnings,
    with_overrides,
)
from .install import install_clis, opencode_bin
from .prompts import prompt_and_files
from .stream_json import json_lines

PROVIDER = "agentrl"
# Tools whose calls leave the sandbox. A permission of "deny" removes the tool from what the model is
# offered (the first request's tools, measured: bash, edit, glob, grep, read, skill, task, todowrite, write).
WEB_TOOLS = ("webfetch", "websearch", "codesearch")
# OpenCode caps the output it reserves below the window at this (SessionPrompt.OUTPUT_TOKEN_MAX).
OUTPUT_TOKEN_MAX = 32_000
OFF = ("MODELS_FETCH", "AUTOUPDATE", "DEFAULT_PLUGINS", "LSP_DOWNLOAD", "SHARE", "PRUNE", "PROJECT_CONFIG",
       "CLAUDE_CODE", "EXTERNAL_SKILLS")


def config(run: HarnessRun) -> dict[str, Any]:
    return {
        "provider": {PROVIDER: {
            "npm": "@ai-sdk/openai-compatible",      # bundled in the binary: nothing is downloaded
            "name": PROVIDER,
            "options": {"baseURL": f"{run.base_url}/v1", "apiKey": run.api_key},
            "models": {run.model: {"name": run.model,
                                   "limit": {"context": run.max_context, "output": run.max_new_tokens}}},
        }},
        "model": f"{PROVIDER}/{run.model}",
        "autoupdate": False,
        "share": "disabled",
        "permission": {**dict.fromkeys(WEB_TOOLS, "deny"), "edit": "allow", "bash": "allow"},
    }


def fires_at(run: HarnessRun) -> int:
    """Where OpenCode compacts: once a turn's tokens pass the window less the output it reserves
    (session/compaction.ts, isOverflow)."""
    return run.max_context - min(run.max_new_tokens, OUTPUT_TOKEN_MAX)


class OpenCode:
    name = "opencode"
    protocol: WireProtocol = "openai"

    def install(self, tools_dir: Path) -> None:
        install_clis(tools_dir)

    def command(self, run: HarnessRun) -> AgentCommand:
        prompt, files = prompt_and_files(run)
        config_path = f"{run.home}/.config/opencode/opencode.json"
        files[config_path] = json.dumps(config(run), indent=1).encode()
        # --auto approves what the config does not deny: left to ask, a headless run rejects any command that
        # names a path outside the work tree (measured: `touch /opt/...` refused whole), as a user cannot answer.
        argv = [f"{run.tools_dir}/clis/{opencode_bin(platform.machine())}", "run", "--format", "json", "--pure",
                "--auto", "--title", "agentrl"]
        env = {"HOME": run.home, "OPENCODE_CONFIG": config_path, **{f"OPENCODE_DISABLE_{k}": "1" for k in OFF}}
        argv, env = with_overrides(argv, env, run)
        # After `--`, a task text that starts with "-" stays the message.
        argv += ["--", prompt]
        warnings = compaction_warnings(run, fires_at(run), "OpenCode") + argv_size_warnings(prompt)
        return AgentCommand(argv=argv, env=env, files=files, warnings=warnings)

    def read_trajectory(self, stdout: bytes, stderr: bytes) -> Trajectory:
        return read_opencode_json(stdout)


def read_opencode_json(stdout: bytes) -> Trajectory:
    """`opencode run --format json`: one event a line (step_start, text, tool_use, step_finish, error), each
    with its `part`. A step is one model reply: `turns` counts step_finish, `tool_calls` tool_use; the final
    text is the last text part's, the exit reason the last step's (`stop`, `tool-calls`, `length`) or
    `error`. Without a finished step the output is not ok. Never raises."""
    try:
        events = json_lines(stdout)
    except Exception:  # noqa: BLE001 - a reader of foreign output must not raise
        return UNREADABLE
    turns = tool_calls = 0
    final: str | None = None
    reason: str | None = None
    for event in events:
        kind, part = event.get("type"), event.get("part")
        part = part if isinstance(part, dict) else {}
        if kind == "step_finish":
            turns += 1
            reason = part.get("reason") if isinstance(part.get("reason"), str) else reason
        elif kind == "tool_use":
            tool_calls += 1
        elif kind == "text" and isinstance(part.get("text"), str):
            final = part["text"]
        elif kind == "error":
            reason = "error"
    return Trajectory(final_text=final, turns=turns, tool_calls=tool_calls, exit_reason=reason,
                      raw_ok=turns > 0 and reason != "error")
