"""The built-in harness: builtin_agent.py (one bash tool, OpenAI API) run by the image's own python3.

For images without Node.js, and the embedded default. It has no compaction: a turn whose prompt fills the
context gets the adapter's length stop, and the agent ends there (exit 2).
"""

from __future__ import annotations

from pathlib import Path

from .base import (
    AgentCommand,
    HarnessRun,
    Trajectory,
    WireProtocol,
    argv_size_warnings,
    compaction_warnings,
    read_summary_line,
    with_overrides,
)
from .install import install_file
from .prompts import prompt_and_files

AGENT_SOURCE = Path(__file__).with_name("builtin_agent.py")
AGENT_FILE = "builtin_agent.py"


class Builtin:
    name = "builtin"
    protocol: WireProtocol = "openai"

    def install(self, tools_dir: Path) -> None:
        install_file(AGENT_SOURCE, tools_dir / AGENT_FILE)

    def command(self, run: HarnessRun) -> AgentCommand:
        prompt, files = prompt_and_files(run)
        argv = ["python3", f"{run.tools_dir}/{AGENT_FILE}", "--base-url", f"{run.base_url}/v1",
                "--model", run.model, "--max-tokens", str(run.max_new_tokens)]
        env = {"HOME": run.home, "OPENAI_API_KEY": run.api_key}   # the key stays out of argv (and `ps`)
        argv, env = with_overrides(argv, env, run)
        argv += ["--", prompt]
        return AgentCommand(argv=argv, env=env, files=files,
                            warnings=compaction_warnings(run, None, "the builtin agent") + argv_size_warnings(prompt))

    def read_trajectory(self, stdout: bytes, stderr: bytes) -> Trajectory:
        return read_summary_line(stdout)
