"""The Codex CLI (OpenAI Responses API), run as `codex exec --json` (docs/agent-clis.md, docs/harnesses.md).

Codex is a static (musl) native binary: it runs by path from the tools directory, in any Linux image,
without Node. Everything it reads is in HOME/.codex/config.toml, which the harness writes: the adapter
as its model provider, its own sandbox and approvals off (the sandbox is ours), and every feature that
would reach the network or put what the rollout never asked for into the prompt turned off. Codex
refuses a repeated flag (clap: "cannot be used multiple times"), so argv holds only what has no
config key; `extra_args` may add `--model` or `-c key=value` (repeatable), which beat the file.
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
from .install import CODEX_BIN, install_clis
from .prompts import prompt_and_files
from .stream_json import json_lines

PROVIDER = "agentrl"
KEY_ENV = "AGENTRL_API_KEY"   # the session key; Codex sends it as `Authorization: Bearer`
# Items of `codex exec --json` that are not the model's tool calls (everything else is one: command_execution,
# file_change, mcp_tool_call, web_search, collab_tool_call, ...).
NOT_TOOL_ITEMS = frozenset({"agent_message", "reasoning", "error", "todo_list"})


def _toml(value: Any) -> str:
    """A TOML value: JSON's strings, integers and booleans are TOML's too."""
    if isinstance(value, bool | int | str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"no TOML for {value!r}")


def config(run: HarnessRun) -> dict[str, dict[str, Any]]:
    """config.toml as tables ("" is the top level). Every key was checked against 0.171.0 with
    `--strict-config`, which the command passes, so a key the pinned CLI does not know is an error."""
    return {
        "": {
            "model": run.model,
            "model_provider": PROVIDER,
            # An unknown model gets fallback metadata: tell it the real window and where to compact.
            "model_context_window": run.max_context,
            "model_auto_compact_token_limit": compact_trigger(run),
            "approval_policy": "never",
            "sandbox_mode": "danger-full-access",   # we are the sandbox; a nested one would need user namespaces
            "web_search": "disabled",
            "check_for_update_on_startup": False,
        },
        f"model_providers.{PROVIDER}": {
            "name": "agentrl adapter",
            "base_url": f"{run.base_url}/v1",        # Codex appends /responses
            "env_key": KEY_ENV,
            "wire_api": "responses",                 # the only value 0.171.0 accepts
            "supports_websockets": False,
        },
        "features": {
            "plugins": False,        # plugin sync: a DNS lookup at startup (the only traffic off the adapter)
            "remote_plugin": False,
            "apps": False,           # ChatGPT connectors
            "tool_suggest": False,
            "image_generation": False,
            "daemon_auto_start": False,   # no background app-server outliving the run
        },
        "skills.bundled": {"enabled": False},   # ~2 kB of skills (imagegen, openai-docs, ...) in every prompt
        "analytics": {"enabled": False},
        "feedback": {"enabled": False},
        "otel": {"exporter": "none"},
        "history": {"persistence": "none"},
    }


def config_toml(run: HarnessRun) -> str:
    out = []
    for table, values in config(run).items():
        if table:
            out.append(f"\n[{table}]")
        out += [f"{key} = {_toml(value)}" for key, value in values.items()]
    return "\n".join(out).lstrip() + "\n"


class Codex:
    name = "codex"
    protocol: WireProtocol = "openai"

    def install(self, tools_dir: Path) -> None:
        install_clis(tools_dir)

    def command(self, run: HarnessRun) -> AgentCommand:
        prompt, files = prompt_and_files(run)
        codex_home = f"{run.home}/.codex"
        files[f"{codex_home}/config.toml"] = config_toml(run).encode()
        # --skip-git-repo-check: the work tree is not a "trusted" project, and trusting it would let the
        # task's own .codex/config.toml in. --strict-config: an unknown key fails instead of being ignored.
        argv = [f"{run.tools_dir}/clis/{CODEX_BIN}", "exec", "--json", "--skip-git-repo-check", "--strict-config"]
        env = {"HOME": run.home, "CODEX_HOME": codex_home, KEY_ENV: run.api_key}
        argv, env = with_overrides(argv, env, run)
        # After `--`, a task text that starts with "-" stays the prompt (a prompt of exactly "-" would
        # make Codex read stdin, which the sandbox closes: an empty prompt).
        argv += ["--", prompt]
        warnings = compaction_warnings(run, compact_trigger(run), "Codex") + argv_size_warnings(prompt)
        return AgentCommand(argv=argv, env=env, files=files, warnings=warnings)

    def read_trajectory(self, stdout: bytes, stderr: bytes) -> Trajectory:
        return read_codex_json(stdout)


def read_codex_json(stdout: bytes) -> Trajectory:
    """`codex exec --json`: one event a line (thread.started, turn.started, item.started/updated/completed,
    turn.completed or turn.failed, error). The final text is the last agent_message; the exit reason is
    how the turn ended ("completed" or "failed"); without either end the output is not ok.

    The events do not say which items one model reply produced, so `turns` counts an agent_message, and
    a tool call that does not directly follow one, as a reply each: exact for replies of text and at
    most one call, an upper bound when a reply makes parallel calls. Never raises."""
    try:
        events = json_lines(stdout)
    except Exception:  # noqa: BLE001 - a reader of foreign output must not raise
        return UNREADABLE
    turns = tool_calls = 0
    final: str | None = None
    reason: str | None = None
    previous: str | None = None
    for event in events:
        kind = event.get("type")
        if kind in ("turn.completed", "turn.failed"):
            reason = kind.removeprefix("turn.")
            continue
        item = event.get("item")
        if kind != "item.completed" or not isinstance(item, dict) or not isinstance(item.get("type"), str):
            continue
        item_type = item["type"]
        if item_type == "agent_message":
            turns += 1
            text = item.get("text")
            final = text if isinstance(text, str) else final
        elif item_type not in NOT_TOOL_ITEMS:
            tool_calls += 1
            if previous != "agent_message":
                turns += 1
        else:
            continue
        previous = item_type
    return Trajectory(final_text=final, turns=turns, tool_calls=tool_calls, exit_reason=reason,
                      raw_ok=reason is not None)
