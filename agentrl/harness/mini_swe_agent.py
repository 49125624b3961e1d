"""mini-swe-agent (OpenAI chat API), its `mini` command run unattended (docs/harnesses.md).

Two harnesses, one per output format of mini-swe-agent 2: `mini_swe_agent` (its default mini.yaml:
one `bash` tool, tool calls) and `mini_swe_agent_text` (mini_textbased.yaml: one ```mswea_bash_command
block per reply, parsed by regex). The episode ends when a command prints
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT first; a reply without exactly one action is a format error:
mini drops that reply from its history and sends its "Format error" message instead (docs/agent-clis.md).

It is a Python program, installed with a copy of the Python that runs agentrl in TOOLS/mini-swe-agent
(python_tool.py): its launcher agentrl_mini.py (mini_swe_agent_run.py), and in site/ its model classes
pointed at the adapter, not litellm (agentrl_mini_model.py, from mini_swe_agent_model.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

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
from .install import MINI_DIR
from .prompts import prompt_and_files
from .python_tool import PythonTool, launch_env, running_python

PACKAGE = "mini-swe-agent"
VERSION = "2.4.6"
DIR = MINI_DIR                             # under the tools directory
LAUNCHER_SOURCE = Path(__file__).with_name("mini_swe_agent_run.py")
MODEL_SOURCE = Path(__file__).with_name("mini_swe_agent_model.py")
# mini-swe-agent 2.4.6's requirements, less those its `mini` command never imports with our model classes:
# litellm and openai (its default model layer; 230 MB, and 2.6 s of CPU to import at every start), datasets
# (SWE-bench batch runs; 330 MB with pyarrow and pandas) and textual (the trajectory inspector), as pip resolved
# them on 2026-12-05 (CPython 3.11): pyyaml requests jinja2 pydantic>=2.0 tenacity rich python-dotenv typer
# platformdirs prompt_toolkit. Installed exactly, mini-swe-agent without its own requirements.
PINS = """
annotated-doc==0.0.7 annotated-types==0.8.0 certifi==2026.10.19.post1 charset-normalizer==3.5.3 idna==3.20
Jinja2==3.1.6 markdown-it-py==4.3.0 MarkupSafe==3.0.4 mdurl==0.1.2 platformdirs==4.14.9 prompt_toolkit==3.0.53
pydantic==2.14.4 pydantic_core==2.50.5 Pygments==2.21.0 python-dotenv==1.2.4 PyYAML==6.0.4 requests==2.34.2
rich==15.0.0 shellingham==1.5.4 tenacity==9.2.1 typer==0.29.2 typing_extensions==4.16.0 typing-inspection==0.4.5
urllib3==2.8.0 wcwidth==0.9.4
""".split()
TOOL = PythonTool(dir=DIR, package=PACKAGE, version=VERSION, pins=(*PINS, f"{PACKAGE}=={VERSION}"),
                  own_files=((LAUNCHER_SOURCE, "agentrl_mini.py"), (MODEL_SOURCE, "site/agentrl_mini_model.py")),
                  interpreter=running_python)
CHECKOUT_MINI = TOOL.checkout              # what `make clis` builds in a source checkout
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# The read timeout of a model call (mini's own is 60 s, and mini retries a timed-out call: the same turn
# generated again). The sandbox's time limit is the real bound.
REQUEST_TIMEOUT_S = 3600

Format = Literal["toolcall", "text"]
CONFIGS: dict[str, tuple[str, str]] = {   # format -> (mini's builtin config, the model class)
    "toolcall": ("mini.yaml", "agentrl_mini_model.AdapterModel"),
    "text": ("mini_textbased.yaml", "agentrl_mini_model.AdapterTextbasedModel"),
}


def config(run: HarnessRun, fmt: Format) -> dict[str, Any]:
    """The config layered over mini's own (`-c BUILTIN -c THIS`): unattended, no cost accounting, the adapter."""
    return {
        "agent": {
            "mode": "yolo",              # run every command without asking
            "confirm_exit": False,       # and end at the submission instead of asking for a new task
            "cost_limit": 0,             # no price for our model: 0 is no limit
        },
        "model": {
            "model_class": CONFIGS[fmt][1],
            "model_name": run.model,
            # Our model has no price: by default the first call's missing cost stops the run.
            "cost_tracking": "ignore_errors",
            "api_url": f"{run.base_url}/v1/chat/completions",
            "request_timeout": REQUEST_TIMEOUT_S,
            "model_kwargs": {"max_tokens": run.max_new_tokens},   # sent in the request's body
        },
        "environment": {"environment_class": "local"},   # commands run here, inside the sandbox
    }


class MiniSweAgent:
    protocol: WireProtocol = "openai"

    def __init__(self, fmt: Format = "toolcall") -> None:
        if fmt not in CONFIGS:
            raise ValueError(f"mini-swe-agent's format is 'toolcall' or 'text', got {fmt!r}")
        self.format: Format = fmt
        self.name = "mini_swe_agent" if fmt == "toolcall" else "mini_swe_agent_text"

    def install(self, tools_dir: Path) -> None:
        TOOL.install(tools_dir)

    def command(self, run: HarnessRun) -> AgentCommand:
        prompt, files = prompt_and_files(run)
        config_dir = f"{run.home}/.config/mini-swe-agent"     # platformdirs' user config dir for HOME
        ours = f"{config_dir}/agentrl.yaml"
        files[ours] = json.dumps(config(run, self.format), indent=1).encode()   # JSON is YAML
        root = f"{run.tools_dir}/{DIR}"
        argv = [*TOOL.argv(root), "-c", CONFIGS[self.format][0], "-c", ours]
        env = {
            "HOME": run.home,
            **launch_env(root),              # the bundled libraries; the launcher takes them out again
            "OPENAI_API_KEY": run.api_key,   # the model class sends it as Authorization: Bearer
            "MSWEA_CONFIGURED": "1",         # else the first run asks for a default model and key on stdin
            "MSWEA_SILENT_STARTUP": "1",     # no banner
        }
        argv, env = with_overrides(argv, env, run)
        argv += ["--", prompt]
        warnings = compaction_warnings(run, None, "mini-swe-agent") + argv_size_warnings(prompt)
        return AgentCommand(argv=argv, env=env, files=files, warnings=warnings)

    def read_trajectory(self, stdout: bytes, stderr: bytes) -> Trajectory:
        return read_summary_line(stdout)
