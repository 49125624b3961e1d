"""Real agent CLIs (Claude Code, Qwen Code) through the adapter, a scripted model behind it.

Each CLI runs a tool-using session: the scripted model calls the CLI's shell tool, the CLI
executes it and sends the result back, the model answers. The session must come out as one
sample whose trained tokens are exactly the sampled ids, with their logprobs.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from ci import skip_or_fail
from scripted_upstream import ScriptedUpstream, assert_one_exact_sample

from agentrl.adapter.serve import AdapterServer
from agentrl.adapter.service import Adapter, AdapterConfig

pytestmark = pytest.mark.integration

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".agent-clis/node_modules/.bin"


def cli(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        problem = f"{path} is missing: run `make clis`"
        skip_or_fail("the agent CLI tests", problem)
    return path


def shell_call(tool: str, command: str) -> dict:
    return {"role": "assistant", "content": "I will write the file.", "reasoning_content": "A shell call does it.",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": tool, "arguments": {
                "command": command, "description": "write out.txt"}}}]}


DONE = {"role": "assistant", "content": "Done: out.txt holds hi.", "reasoning_content": "It worked."}


def run_session(tiny_model, tmp_path, steps, argv_env):
    """Serve, run the CLI (argv_env(url, key, home) -> argv, env), finish; (result, sampled ids, cli run)."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    with ScriptedUpstream(tiny_model, steps) as upstream:
        adapter = Adapter(AdapterConfig(tokenizer=tiny_model, upstreams=[upstream.url], max_context=131072))
        with AdapterServer(adapter) as server:
            key = adapter.sessions.open().key
            argv, env = argv_env(server.url, key, home)
            run = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=300)
            result = adapter.sessions.finish(key).to_json()     # what finish_session replies
            sampled = [upstream.output_ids(s) for s in steps]
            calls = len(upstream.requests)
    return result, sampled, run, calls, work


def base_env(home: Path) -> dict:
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}


def test_claude_code_tool_session_is_one_exact_sample(tiny_model, tmp_path):
    claude = cli("claude")
    steps = [shell_call("Bash", "echo hi > out.txt"), shell_call("Bash", "echo there >> out.txt"), DONE]

    def argv_env(url, key, home):
        env = {**base_env(home), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": key, "IS_SANDBOX": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_ATTRIBUTION_HEADER": "0"}
        return [str(claude), "-p", "Write hi into out.txt.", "--model", "agentrl-tiny", "--output-format",
                "stream-json", "--verbose", "--dangerously-skip-permissions"], env
    result, sampled, run, calls, work = run_session(tiny_model, tmp_path, steps, argv_env)
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    assert (work / "out.txt").read_text() == "hi\nthere\n" and calls == 3
    final = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")][-1]
    assert final["type"] == "result" and "Done: out.txt holds hi." in final["result"]
    assert_one_exact_sample(result, sampled)


def test_qwen_code_tool_session_is_one_exact_sample(tiny_model, tmp_path):
    qwen = cli("qwen")
    steps = [shell_call("run_shell_command", "echo hi > out.txt"),
             shell_call("run_shell_command", "echo there >> out.txt"), DONE]

    def argv_env(url, key, home):
        (home / ".qwen").mkdir()
        (home / ".qwen/settings.json").write_text(json.dumps({
            "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False},
            "privacy": {"usageStatisticsEnabled": False}, "general": {"enableAutoUpdate": False}}))
        env = {**base_env(home), "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": key,
               "OPENAI_MODEL": "agentrl-tiny"}
        return [str(qwen), "-p", "Write hi into out.txt.", "--yolo", "--auth-type", "openai"], env
    result, sampled, run, calls, work = run_session(tiny_model, tmp_path, steps, argv_env)
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    assert (work / "out.txt").read_text() == "hi\nthere\n" and calls == 3
    assert "Done: out.txt holds hi." in run.stdout
    assert_one_exact_sample(result, sampled)
