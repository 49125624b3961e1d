"""CodeBuddy Code (Tencent; OpenAI API through a custom model), built from its documentation only.

UNTESTED against the real binary: the npm registry reachable here does not serve
@tencent-ai/codebuddy-code, so `install` fails with npm's answer. The command and files below follow
CodeBuddy's CLI reference, headless, env-vars and models.json pages (sources in docs/harnesses.md);
the tests check what this module writes, not what the CLI does with it.
"""

from __future__ import annotations

import json
import subprocess
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
from .install import NODE_BIN_DIR, install_node, install_npm_package
from .prompts import prompt_and_files
from .stream_json import read_stream_json

PACKAGE = "@tencent-ai/codebuddy-code"
VERSION = "2.161.1"
BIN = "codebuddy/node_modules/.bin/codebuddy"
WEB_TOOLS = ("WebSearch", "WebFetch")
# The npm entry point is a `#!/usr/bin/env node` script: the tools directory's node goes at the END of
# PATH, so an image's own node still wins for the agent's commands and this one is only the fallback.
PATH_FALLBACK = 'PATH="$PATH:$0" exec "$@"'


def models_json(run: HarnessRun) -> dict:
    """The custom model (docs: models.json): an OpenAI chat-completions endpoint, its window and output cap."""
    return {
        "models": [{
            "id": run.model, "name": run.model, "vendor": "OpenAI",
            "apiKey": run.api_key,
            "url": f"{run.base_url}/v1/chat/completions",   # the full path, as models.json requires
            "maxInputTokens": run.max_context,
            "maxOutputTokens": run.max_new_tokens,
            "supportsToolCall": True, "supportsImages": False, "supportsReasoning": True,
        }],
        "availableModels": [run.model],
    }


def version_ready(bin_path: Path) -> bool:
    try:
        r = subprocess.run([str(bin_path), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and r.stdout.strip() in (VERSION, f"{VERSION} (CodeBuddy Code)")


class CodeBuddy:
    name = "codebuddy"
    protocol: WireProtocol = "openai"

    def install(self, tools_dir: Path) -> None:
        install_node(tools_dir)
        install_npm_package(tools_dir / "codebuddy", f"{PACKAGE}@{VERSION}",
                            lambda d: version_ready(d / "node_modules/.bin/codebuddy"))

    def command(self, run: HarnessRun) -> AgentCommand:
        prompt, files = prompt_and_files(run)
        files[f"{run.home}/.codebuddy/models.json"] = json.dumps(models_json(run), indent=1).encode()
        argv = ["/bin/sh", "-c", PATH_FALLBACK, f"{run.tools_dir}/{NODE_BIN_DIR}",
                f"{run.tools_dir}/{BIN}", "-p",
                "--disallowedTools", *WEB_TOOLS,
                "--model", run.model, "--output-format", "stream-json", "--verbose",
                "--dangerously-skip-permissions"]   # headless docs: required for tools under -p
        env = {
            "HOME": run.home,
            "CODEBUDDY_API_KEY": run.api_key,   # env-vars docs: always used in -p mode
            # CodeBuddy puts a memory block into every prompt: overhead with no cross-session continuity
            # in a rollout, and it teaches the model to narrate such blocks. (Not on the env-vars page;
            # the name integrations of the CLI use.)
            "CODEBUDDY_DISABLE_AUTO_MEMORY": "1",
            "CODEBUDDY_CODE_ENABLE_TELEMETRY": "0",
            "DISABLE_AUTOUPDATER": "1",
        }
        if run.as_root:
            env["CODEBUDDY_IS_SANDBOX"] = "1"
        argv, env = with_overrides(argv, env, run)
        argv += ["--", prompt]
        warnings = compaction_warnings(run, None, "CodeBuddy Code") + argv_size_warnings(prompt)
        return AgentCommand(argv=argv, env=env, files=files, warnings=warnings)

    def read_trajectory(self, stdout: bytes, stderr: bytes) -> Trajectory:
        return read_stream_json(stdout)
