"""Runs the OpenHands SDK's agent on one task, then prints a summary line.

Installed as TOOLS/openhands/agentrl_openhands.py and run by the Python bundled beside it (openhands.py):

    LD_LIBRARY_PATH=TOOLS/openhands/python/lib \\
    TOOLS/openhands/python/bin/python3 -I -S TOOLS/openhands/agentrl_openhands.py CONFIG [--KEY VALUE ...] -- TASK
    ... --version    prints "openhands-sdk VERSION" once the SDK and the two tools import

CONFIG is a JSON file: {"model", "base_url" (the adapter's OpenAI endpoint, .../v1), "max_input_tokens",
"max_output_tokens", "timeout_s", "max_iterations"}; `--KEY VALUE` pairs (a harness run's extra_args: the last
one wins) replace its keys, VALUE read as JSON where it is JSON (`--max-iterations 30`, `--model other`). The
session key comes in OPENHANDS_LLM_API_KEY. The agent has the terminal (a plain bash subprocess: no tmux in most
task images) and the file editor, acting on the working directory, beside the SDK's own finish and think;
nothing is confirmed, nothing persisted.

The last stdout line is {"final_text", "turns", "tool_calls", "exit_reason"}: the agent's last message (its
finish message, else its last text), the completions, the tool calls, and the conversation's execution status.
Exit codes: 0 the agent finished, 2 it stopped otherwise (stuck, error, the iteration limit), 1 an exception.
Stdlib only until the site directory is added.
"""

from __future__ import annotations

import json
import os
import site
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(HERE, "python", "lib")
SITE = os.path.join(HERE, "site")
KEY_ENV = "OPENHANDS_LLM_API_KEY"
# Before litellm is imported: else it downloads its model price map from GitHub at import (no network here).
QUIET = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "OPENHANDS_SUPPRESS_BANNER": "1"}


def restore_library_path() -> None:
    parts = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and p.rstrip("/") != LIB]
    if parts:
        os.environ["LD_LIBRARY_PATH"] = ":".join(parts)
    else:
        os.environ.pop("LD_LIBRARY_PATH", None)


def text_of(content) -> str | None:
    texts = [t for part in content or [] if isinstance(t := getattr(part, "text", None), str)]
    return "".join(texts) if texts else None


def summary(events, completions: int, status: str) -> dict:
    """What the conversation's events say: the final text, the model calls, the tool calls, the status."""
    final: str | None = None
    calls = 0
    for event in events:
        kind = type(event).__name__
        if kind == "ActionEvent":
            calls += 1
            action = getattr(event, "action", None)
            message = getattr(action, "message", None)
            if type(action).__name__ == "FinishAction" and isinstance(message, str):
                final = message
        elif kind == "MessageEvent" and getattr(event, "source", None) == "agent":
            final = text_of(getattr(getattr(event, "llm_message", None), "content", None)) or final
    return {"final_text": final, "turns": completions, "tool_calls": calls, "exit_reason": status}


def json_or_text(value: str):
    try:
        return json.loads(value)
    except ValueError:
        return value


def run(config: dict, task: str) -> dict:
    from openhands.sdk import LLM, Agent, Conversation, Tool  # type: ignore[import-not-found]
    from openhands.sdk.llm.utils import model_features  # type: ignore[import-not-found]
    from openhands.tools.file_editor import FileEditorTool  # type: ignore[import-not-found]
    from openhands.tools.terminal import TerminalTool  # type: ignore[import-not-found]
    from pydantic import SecretStr

    # The SDK echoes a reply's reasoning_content only for models it lists; without it every turn's history
    # differs from what was sampled and the chain forks (measured: one sample a turn).
    model_features.SEND_REASONING_CONTENT_MODELS.append(config["model"])
    llm = LLM(model=f"openai/{config['model']}", base_url=config["base_url"], usage_id="agent",
              api_key=SecretStr(os.environ.pop(KEY_ENV)), native_tool_calling=True,
              max_input_tokens=config["max_input_tokens"], max_output_tokens=config["max_output_tokens"],
              timeout=config["timeout_s"], caching_prompt=False)
    agent = Agent(llm=llm, tools=[Tool(name=TerminalTool.name, params={"terminal_type": "subprocess"}),
                                  Tool(name=FileEditorTool.name)])
    conversation = Conversation(agent=agent, workspace=os.getcwd(), visualizer=None,
                                max_iteration_per_run=config["max_iterations"])
    conversation.send_message(task)
    conversation.run()
    status = conversation.state.execution_status
    return summary(list(conversation.state.events), len(llm.metrics.token_usages), getattr(status, "value", status))


def main(argv: list[str]) -> int:
    restore_library_path()
    site.addsitedir(SITE)
    if argv == ["--version"]:
        os.environ.update(QUIET)
        from importlib.metadata import version

        import openhands.tools.file_editor  # type: ignore[import-not-found]  # noqa: F401
        import openhands.tools.terminal  # noqa: F401
        print(f"openhands-sdk {version('openhands-sdk')}")
        return 0
    options = argv[1:-2]
    if len(argv) < 3 or argv[-2] != "--" or KEY_ENV not in os.environ or len(options) % 2 \
            or not all(key.startswith("--") for key in options[::2]):
        print(f"usage: {KEY_ENV}=KEY agentrl_openhands.py CONFIG [--KEY VALUE ...] -- TASK", file=sys.stderr)
        return 64
    with open(argv[0]) as f:
        config = json.load(f)
    for key, value in zip(options[::2], options[1::2], strict=True):
        config[key[2:].replace("-", "_")] = json_or_text(value)
    os.environ.update(QUIET)
    out = run(config, argv[-1])
    print(json.dumps(out))
    return 0 if out["exit_reason"] == "finished" else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
