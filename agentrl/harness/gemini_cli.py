"""Gemini CLI (npm `@google/gemini-cli`; Gemini's API, the adapter's /v1beta endpoint), run headless with
stream-json output (docs/agent-clis.md, docs/harnesses.md).

Gemini CLI is a Node.js program: it runs on the tools directory's own node, as Qwen Code (a fork of it)
does. Its requests go to GOOGLE_GEMINI_BASE_URL with the session key as x-goog-api-key.

What keeps a session one clean chain: the model named in the settings (no model router), loop detection
off (an LLM check after many turns: a side request), the next-speaker check off (its default). What keeps
it in the sandbox: the web tools excluded, usage statistics, telemetry and updates off.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import (
    UNREADABLE,
    AgentCommand,
    HarnessRun,
    Trajectory,
    WireProtocol,
    argv_size_warnings,
    compact_trigger,
    compaction_warnings,
    with_overrides,
)
from .install import GEMINI_ENTRY, NODE_BIN, install_clis, install_node
from .prompts import prompt_and_files
from .stream_json import json_lines

WEB_TOOLS = ("web_fetch", "google_web_search")
# Gemini CLI's window for a model it does not know (tokenLimit's DEFAULT_TOKEN_LIMIT): compression fires
# at model.compressionThreshold times this.
ASSUMED_WINDOW = 1_048_576


def compression_threshold(run: HarnessRun) -> float:
    """The fraction of its assumed window at which Gemini CLI compresses at the requested token."""
    return compact_trigger(run) / ASSUMED_WINDOW


def settings(run: HarnessRun) -> dict[str, Any]:
    return {
        "security": {"auth": {"selectedType": "gemini-api-key"},
                     # A headless run cannot answer the trust prompt; untrusted, YOLO falls back to asking.
                     "folderTrust": {"enabled": False}},
        "model": {"name": run.model, "compressionThreshold": compression_threshold(run),
                  "disableLoopDetection": True, "skipNextSpeakerCheck": True},
        "tools": {"exclude": list(WEB_TOOLS)},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    }


class GeminiCli:
    name = "gemini_cli"
    protocol: WireProtocol = "gemini"

    def install(self, tools_dir: Path) -> None:
        install_clis(tools_dir)
        install_node(tools_dir)

    def command(self, run: HarnessRun) -> AgentCommand:
        prompt, files = prompt_and_files(run)
        files[f"{run.home}/.gemini/settings.json"] = json.dumps(settings(run), indent=1).encode()
        argv = [f"{run.tools_dir}/{NODE_BIN}", f"{run.tools_dir}/clis/{GEMINI_ENTRY}", "--yolo",
                "--output-format", "stream-json"]
        env = {"HOME": run.home, "GEMINI_API_KEY": run.api_key, "GOOGLE_GEMINI_BASE_URL": run.base_url,
               "GEMINI_CLI_NO_RELAUNCH": "true"}     # one process: no child node started for more heap
        argv, env = with_overrides(argv, env, run)
        # `--prompt=` keeps a task text that starts with "-" a value.
        argv.append(f"--prompt={prompt}")
        warnings = compaction_warnings(run, int(compression_threshold(run) * ASSUMED_WINDOW), "Gemini CLI")
        return AgentCommand(argv=argv, env=env, files=files, warnings=warnings + argv_size_warnings(prompt))

    def read_trajectory(self, stdout: bytes, stderr: bytes) -> Trajectory:
        return read_gemini_stream_json(stdout)


def read_gemini_stream_json(stdout: bytes) -> Trajectory:
    """`gemini --output-format stream-json`: init, message (user, or assistant deltas), tool_use,
    tool_result, result ({status, stats}). A model reply is a run of assistant messages and tool calls
    between the user's side (init, the user's message, tool results): `turns` counts those runs. The final
    text is the last run's assistant text; the exit reason the result's status; without a result the
    output is not ok. Never raises."""
    try:
        events = json_lines(stdout)
    except Exception:  # noqa: BLE001 - a reader of foreign output must not raise
        return UNREADABLE
    turns = tool_calls = 0
    text: list[str] = []
    final: str | None = None
    reason: str | None = None
    in_reply = False
    for event in events:
        kind = event.get("type")
        is_reply = (kind == "message" and event.get("role") == "assistant") or kind == "tool_use"
        if is_reply and not in_reply:
            turns += 1
            text, final = [], None
        in_reply = is_reply or (in_reply and kind not in ("tool_result", "init", "message", "result"))
        if kind == "tool_use":
            tool_calls += 1
        elif kind == "message" and event.get("role") == "assistant" and isinstance(event.get("content"), str):
            text.append(event["content"])
            final = "".join(text)
        elif kind == "result":
            reason = event.get("status") if isinstance(event.get("status"), str) else "unknown"
    return Trajectory(final_text=final, turns=turns, tool_calls=tool_calls, exit_reason=reason,
                      raw_ok=reason == "success")
