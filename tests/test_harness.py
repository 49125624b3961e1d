"""Harnesses: the registry, the commands they build (override order, web tools, caps, compaction, prompt
styles), reading their output back, installing them, and the two real CLIs run from their own commands
against the adapter and a scripted model."""

import dataclasses
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from ci import skip_or_fail
from hypothesis import given
from hypothesis import strategies as st
from scripted_upstream import ScriptedUpstream

from agentrl.adapter.serve import AdapterServer
from agentrl.adapter.service import Adapter, AdapterConfig
from agentrl.harness import (
    HARNESSES,
    PROBLEM_FILE,
    HarnessInstallError,
    HarnessRun,
    claude_code,
    get_harness,
    qwen_code,
)
from agentrl.harness.builtin_agent import BASH_TOOL
from agentrl.harness.codebuddy import CodeBuddy
from agentrl.harness.install import PINNED_CLIS, clis_ready
from agentrl.harness.stream_json import read_stream_json

pytestmark = pytest.mark.integration

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
CLI_HARNESSES = ("claude_code", "qwen_code", "codebuddy")


def make_run(**kw) -> HarnessRun:
    base = dict(task_text="Fix the off-by-one in count().", prompt_style="instruction", workdir="/testbed",
                base_url="http://127.0.0.1:8000", api_key="sess-key", model="agentrl-tiny",
                max_new_tokens=16000, max_context=200000)
    return HarnessRun(**{**base, **kw})


def split_prompt(argv: list[str]) -> tuple[list[str], str]:
    """A command's options and its prompt: after the last `--`, or Qwen Code's trailing `--prompt=`."""
    if argv[-1].startswith("--prompt="):
        return argv[:-1], argv[-1].removeprefix("--prompt=")
    cut = len(argv) - 1 - argv[::-1].index("--")
    assert cut == len(argv) - 2, argv
    return argv[:cut], argv[-1]


def flag_value(options: list[str], flag: str) -> str:
    return options[len(options) - 1 - options[::-1].index(flag) + 1]


def test_registry_and_unknown_names():
    assert {n: h.protocol for n, h in HARNESSES.items()} == {
        "claude_code": "anthropic", "qwen_code": "openai", "codex": "openai", "mini_swe_agent": "openai",
        "mini_swe_agent_text": "openai", "codebuddy": "openai", "opencode": "openai", "gemini_cli": "gemini",
        "openhands": "openai", "builtin": "openai"}
    assert all(get_harness(n).name == n for n in HARNESSES)
    with pytest.raises(ValueError, match="builtin, claude_code, codebuddy, codex, gemini_cli, mini_swe_agent, "
                                         "mini_swe_agent_text, opencode, openhands, qwen_code"):
        get_harness("aider")


@pytest.mark.parametrize("change, error", [
    (dict(prompt_style="chat"), ValueError), (dict(max_new_tokens=0), ValueError),
    (dict(max_new_tokens=200000), ValueError), (dict(compact_at=0.0), ValueError),
    (dict(compact_at=1.5), ValueError), (dict(extra_args="--model x"), TypeError)])
def test_a_run_refuses_nonsense(change, error):
    with pytest.raises(error):
        make_run(**change)


# The default each harness sets that a user may want to replace: a flag on argv and a variable in env.
# Codex, mini-swe-agent, OpenCode, Gemini CLI and OpenHands keep the model in their config file, which a --model
# flag beats.
OVERRIDABLE = {"claude_code": ("--model", "CLAUDE_CODE_MAX_OUTPUT_TOKENS"),
               "qwen_code": ("--model", "QWEN_CODE_MAX_OUTPUT_TOKENS"),
               "codex": ("--model", "CODEX_HOME"),
               "mini_swe_agent": ("--model", "OPENAI_API_KEY"),
               "mini_swe_agent_text": ("--model", "LITELLM_LOCAL_MODEL_COST_MAP"),
               "codebuddy": ("--model", "CODEBUDDY_API_KEY"),
               "opencode": ("--model", "OPENCODE_CONFIG"),
               "gemini_cli": ("--model", "GEMINI_CLI_NO_RELAUNCH"),
               "openhands": ("--model", "OPENHANDS_LLM_API_KEY"),
               "builtin": ("--max-tokens", "OPENAI_API_KEY")}


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_extra_args_and_env_come_after_the_defaults_so_they_win(name):
    flag, var = OVERRIDABLE[name]
    harness = get_harness(name)
    default = harness.command(make_run())
    over = harness.command(make_run(extra_args=(flag, "other", "--verbose"), extra_env={var: "mine", "X_NEW": "1"}))
    default_options, _ = split_prompt(default.argv)
    options, prompt = split_prompt(over.argv)
    assert options == [*default_options, flag, "other", "--verbose"]   # defaults untouched, knobs last
    assert flag_value(options, flag) == "other"    # every CLI here takes a flag's last occurrence
    assert over.env == {**default.env, var: "mine", "X_NEW": "1"} and default.env.get(var) != "mine"
    assert prompt == split_prompt(default.argv)[1]


@pytest.mark.parametrize("name, flag, tools", [("claude_code", "--disallowedTools", ["WebSearch", "WebFetch"]),
                                               ("codebuddy", "--disallowedTools", ["WebSearch", "WebFetch"]),
                                               ("qwen_code", "--exclude-tools", ["web_fetch", "web_search"])])
def test_web_tools_are_denied_by_the_enforced_flag_not_a_tool_list(name, flag, tools):
    options, _ = split_prompt(get_harness(name).command(make_run()).argv)
    i = options.index(flag)
    assert options[i + 1:i + 1 + len(tools)] == tools
    assert not {"--tools", "--allowedTools", "--allowed-tools", "--core-tools"} & set(options)


def test_the_builtin_agent_has_no_web_tool_at_all():
    assert BASH_TOOL["function"]["name"] == "bash"
    options, _ = split_prompt(get_harness("builtin").command(make_run()).argv)
    assert "--tools" not in options


def max_output(name: str, run: HarnessRun) -> int:
    cmd = get_harness(name).command(run)
    if name == "claude_code":
        return int(cmd.env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"])
    if name == "qwen_code":
        return int(cmd.env["QWEN_CODE_MAX_OUTPUT_TOKENS"])
    if name == "codebuddy":
        return json.loads(cmd.files[f"{run.home}/.codebuddy/models.json"])["models"][0]["maxOutputTokens"]
    if name == "opencode":
        return json.loads(cmd.files[f"{run.home}/.config/opencode/opencode.json"])["provider"]["agentrl"]["models"][
            run.model]["limit"]["output"]
    if name == "openhands":
        return json.loads(cmd.files[f"{run.home}/.config/agentrl-openhands.json"])["max_output_tokens"]
    if name.startswith("mini_swe_agent"):
        return json.loads(cmd.files[f"{run.home}/.config/mini-swe-agent/agentrl.yaml"])["model"]["model_kwargs"][
            "max_tokens"]
    return int(flag_value(split_prompt(cmd.argv)[0], "--max-tokens"))


# Codex 0.171.0 and Gemini CLI 0.61.0 have no setting for it and send no output cap: the adapter's own
# max_new_tokens caps their turns (the pool sets it; tests/test_harness_codex.py sees it at the model server).
@pytest.mark.parametrize("name", sorted(set(HARNESSES) - {"codex", "gemini_cli"}))
def test_no_turn_cap_and_output_pinned_to_the_turn_budget(name):
    run = make_run(max_new_tokens=12345)
    options, _ = split_prompt(get_harness(name).command(run).argv)
    assert not {"--max-turns", "--max-session-turns", "--max-tool-calls", "--max-wall-time"} & set(options)
    assert max_output(name, run) == 12345


def test_claude_code_env_for_the_adapter():
    run = make_run(as_root=True)
    env = get_harness("claude_code").command(run).env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8000" and env["ANTHROPIC_API_KEY"] == "sess-key"
    assert env["IS_SANDBOX"] == "1" and "IS_SANDBOX" not in get_harness("claude_code").command(make_run()).env
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "200000" and env["CLAUDE_CODE_DISABLE_AUTO_MEMORY"] == "1"
    assert env["HOME"] == "/home/agent"


def test_claude_code_compaction_lands_on_the_requested_token():
    run = make_run(max_context=200000, max_new_tokens=16000, compact_at=0.6)
    pct, fires_at = claude_code.compaction(run)
    assert fires_at == 120000 == int(0.6 * 200000)
    assert int((200000 - 16000) * float(pct) / 100) == 120000   # Claude Code's own floor(E * pct / 100)
    assert get_harness("claude_code").command(run).warnings == []


def test_claude_code_compaction_matches_what_the_binary_did():
    # Measured against 2.1.332 (docs/harnesses.md): with a 32768-token window and 4096 output tokens it
    # compacted between 15625 and 15637 prompt tokens (plus its ~40-token estimate of the new messages)
    # at pct 60 and 80 alike, and between 8557 and 8569 at pct 30.
    for compact_at, measured in ((0.6, 15672), (0.7, 15672)):
        assert claude_code.compaction(make_run(max_context=32768, max_new_tokens=4096, compact_at=compact_at))[1] \
            == measured
    pct, fires_at = claude_code.compaction(make_run(max_context=32768, max_new_tokens=4096, compact_at=0.2625))
    assert fires_at == 8601 and abs(float(pct) - 30) < 0.01
    warning, = get_harness("claude_code").command(make_run(max_context=32768, max_new_tokens=4096)).warnings
    assert "compacts at 15672 tokens, before the requested 19660" in warning


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_a_trigger_above_the_last_full_turn_is_warned_about(name):
    run = make_run(max_context=32768, max_new_tokens=16384, compact_at=0.6)   # 19660 > 32768 - 16384
    assert any("max_context - max_new_tokens (16384)" in w for w in get_harness(name).command(run).warnings)
    assert not any("max_context - max_new_tokens" in w
                   for w in get_harness(name).command(make_run(compact_at=0.6)).warnings)


def test_qwen_code_settings_carry_the_window_the_trigger_and_memory_off():
    run = make_run(max_context=65536, compact_at=0.5, home="/root")
    cmd = get_harness("qwen_code").command(run)
    s = json.loads(cmd.files["/root/.qwen/settings.json"])
    assert s["model"]["generationConfig"]["contextWindowSize"] == 65536 and s["context"]["autoCompactThreshold"] == 0.5
    assert not any(s["memory"].values()) and s["security"]["auth"]["selectedType"] == "openai"
    assert cmd.env["OPENAI_BASE_URL"] == "http://127.0.0.1:8000/v1" and cmd.env["OPENAI_MODEL"] == "agentrl-tiny"
    assert qwen_code.fires_at(run) == 32536   # 65536 - 20000 - 13000 caps 0.5 * 65536 = 32768
    assert any("compacts at 32536 tokens" in w for w in cmd.warnings)
    assert qwen_code.fires_at(make_run(max_context=32768, compact_at=0.6)) == 19660   # no cap below 33000


def test_qwen_code_warns_when_its_output_clamp_bites_before_compaction():
    warnings = get_harness("qwen_code").command(make_run(max_context=32768, max_new_tokens=8192)).warnings
    assert any("passes 14576 tokens, before compaction at 19660" in w for w in warnings)


def test_codebuddy_writes_a_custom_openai_model_and_turns_memory_off():
    run = make_run(as_root=True, max_context=65536, max_new_tokens=4096)
    cmd = CodeBuddy().command(run)
    model, = json.loads(cmd.files["/home/agent/.codebuddy/models.json"])["models"]
    assert model["url"] == "http://127.0.0.1:8000/v1/chat/completions" and model["apiKey"] == "sess-key"
    assert (model["id"], model["maxInputTokens"], model["maxOutputTokens"]) == ("agentrl-tiny", 65536, 4096)
    assert cmd.env["CODEBUDDY_DISABLE_AUTO_MEMORY"] == "1" and cmd.env["CODEBUDDY_IS_SANDBOX"] == "1"
    options, _ = split_prompt(cmd.argv)
    assert options[:5] == ["/bin/sh", "-c", 'PATH="$PATH:$0" exec "$@"', "/opt/agentrl/tools/node/bin",
                           "/opt/agentrl/tools/codebuddy/node_modules/.bin/codebuddy"]
    assert {"-p", "--dangerously-skip-permissions"} <= set(options)
    assert any("no compaction trigger" in w for w in cmd.warnings)


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_instruction_style_puts_the_task_in_a_file_the_prompt_names(name):
    run = make_run(task_text="Make count() include the last item.\n")
    cmd = get_harness(name).command(run)
    _, prompt = split_prompt(cmd.argv)
    assert cmd.files[f"/testbed/{PROBLEM_FILE}"] == b"Make count() include the last item.\n"
    assert PROBLEM_FILE in prompt and "/testbed" in prompt and "count()" not in prompt


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_dataset_style_carries_the_task_text_verbatim_even_when_it_looks_like_a_flag(name):
    text = "- fix count()\n--model x"
    cmd = get_harness(name).command(make_run(prompt_style="dataset", task_text=text))
    assert split_prompt(cmd.argv)[1] == text
    assert not any(path.endswith(PROBLEM_FILE) for path in cmd.files)


def test_a_prompt_too_long_for_one_argument_is_warned_about():
    cmd = get_harness("claude_code").command(make_run(prompt_style="dataset", task_text="x" * 200_000))
    assert any("prompt_style='instruction'" in w for w in cmd.warnings)


# Lines as Claude Code 2.1.332 wrote them (shortened): a tool turn split over two lines, a sub-agent's
# turn, a tool result, the final answer and the result line.
CLAUDE_STREAM = b"\n".join(json.dumps(x).encode() for x in [
    {"type": "system", "subtype": "init", "model": "m", "tools": ["Bash"]},
    {"type": "assistant", "parent_tool_use_id": None, "message": {"content": [{"type": "text", "text": "I will."}]}},
    {"type": "assistant", "parent_tool_use_id": None,
     "message": {"content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]}},
    {"type": "assistant", "parent_tool_use_id": "t0",
     "message": {"content": [{"type": "tool_use", "id": "s1", "name": "Read", "input": {}}]}},
    {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]}},
    {"type": "assistant", "parent_tool_use_id": None, "message": {"content": [{"type": "text", "text": "Done."}]}},
    {"type": "result", "subtype": "success", "num_turns": 2, "result": "Done.", "is_error": False},
]) + b"\n"


def test_stream_json_gives_the_final_text_turns_and_tool_calls():
    t = read_stream_json(b"Ripgrep not available\n" + CLAUDE_STREAM)
    assert (t.final_text, t.turns, t.tool_calls, t.exit_reason, t.raw_ok) == ("Done.", 2, 1, "success", True)
    for name in CLI_HARNESSES:
        assert get_harness(name).read_trajectory(CLAUDE_STREAM, b"") == t


def test_stream_json_without_a_result_line_is_not_ok():
    t = read_stream_json(CLAUDE_STREAM.rsplit(b"\n", 2)[0])
    assert not t.raw_ok and t.final_text == "Done." and t.exit_reason is None


@given(st.binary(max_size=300) | st.lists(st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(
        ["type", "result", "num_turns", "subtype", "message", "content", "text", "parent_tool_use_id"]), c,
        max_size=4)), max_size=4).map(lambda xs: b"\n".join(json.dumps(x).encode() for x in xs)))
def test_reading_any_output_never_raises(stdout):
    for name in HARNESSES:
        t = get_harness(name).read_trajectory(stdout, b"")
        assert isinstance(t.turns, int) and isinstance(t.raw_ok, bool)


def test_installing_the_builtin_agent_is_idempotent(tmp_path):
    harness = get_harness("builtin")
    harness.install(tmp_path)
    agent = tmp_path / "builtin_agent.py"
    first = agent.stat()
    harness.install(tmp_path)
    assert agent.stat().st_ino == first.st_ino and first.st_mode & stat.S_IXOTH
    r = subprocess.run(["python3", str(agent), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--max-turns" in r.stdout


def test_installing_codebuddy_without_npm_says_what_is_missing(tmp_path, monkeypatch):
    node_only = tmp_path / "bin"
    node_only.mkdir()
    (node_only / "node").symlink_to(Path(subprocess.check_output(["which", "node"], text=True).strip()).resolve())
    monkeypatch.setenv("PATH", str(node_only))
    with pytest.raises(HarnessInstallError, match=r"npm is missing: cannot install @tencent-ai/codebuddy-code@"):
        CodeBuddy().install(tmp_path / "tools")
    assert (tmp_path / "tools/node/bin/node").exists()   # the part it could do is done


def cli_install_source() -> Path:
    source = ROOT / ".agent-clis"
    if not clis_ready(source):
        problem = f"{source} does not hold the pinned CLIs {PINNED_CLIS}: run `make clis`"
        skip_or_fail("the agent CLI tests", problem)
    return source


@pytest.fixture(scope="module")
def tools_dir(tmp_path_factory) -> Path:
    """A host tools directory filled by the harnesses' own install (the CLIs copied from `make clis`)."""
    cli_install_source()
    tools = tmp_path_factory.mktemp("tools")
    for name in ("claude_code", "qwen_code"):
        get_harness(name).install(tools)
    return tools


def test_install_fills_the_tools_dir_readable_by_the_agent_user(tools_dir):
    assert clis_ready(tools_dir / "clis")
    node = tools_dir / "node/bin/node"
    assert subprocess.run([str(node), "--version"], capture_output=True, text=True).stdout.startswith("v")
    for path in (tools_dir / "clis", tools_dir / "node", node):
        assert path.stat().st_mode & 0o005 == 0o005, path    # others (uid 1000 in a sandbox) read and enter
    inode = (tools_dir / "clis").stat().st_ino
    get_harness("qwen_code").install(tools_dir)
    assert (tools_dir / "clis").stat().st_ino == inode     # already right: nothing is redone


def shell_call(tool: str, command: str) -> dict:
    return {"role": "assistant", "content": "I will read the task and fix the file.",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": tool, "arguments": {
                "command": command, "description": "fix target.txt"}}}]}


FINAL = {"role": "assistant", "content": "Fixed: target.txt now says fixed."}
TASK = "Replace the word bug in target.txt with fixed."


def run_real_cli(name: str, tool: str, tiny_model, tools_dir: Path, tmp_path: Path):
    """The harness's own command (argv, env, files) against the adapter, on the host; sandbox paths are
    host paths here. Returns (process, trajectory, upstream requests, the upstream, work dir, run)."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "target.txt").write_text("bug\n")
    steps = [shell_call(tool, f"cat {PROBLEM_FILE} && echo fixed > target.txt"), FINAL]
    with ScriptedUpstream(tiny_model, steps) as upstream:
        adapter = Adapter(AdapterConfig(tokenizer=tiny_model, upstreams=[upstream.url], max_context=131072))
        with AdapterServer(adapter) as server:
            key = adapter.sessions.open().key
            run = HarnessRun(task_text=TASK, prompt_style="instruction", workdir=str(work), base_url=server.url,
                             api_key=key, model="agentrl-tiny", max_new_tokens=3000, max_context=131072,
                             home=str(home), tools_dir=str(tools_dir), as_root=os.geteuid() == 0,
                             extra_args=("--model", "agentrl-override"))
            harness = get_harness(name)
            cmd = harness.command(run)
            for path, data in cmd.files.items():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_bytes(data)
            env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **cmd.env}
            proc = subprocess.run(cmd.argv, cwd=work, env=env, capture_output=True, timeout=300)
            adapter.sessions.finish(key)
    return proc, harness.read_trajectory(proc.stdout, proc.stderr), upstream, work, run


def init_model(stdout: bytes) -> str:
    return next(json.loads(line)["model"] for line in stdout.splitlines()
                if line.startswith(b"{") and json.loads(line).get("subtype") == "init")


@pytest.mark.parametrize("name, tool, web_tool", [("claude_code", "Bash", "WebFetch"),
                                                  ("qwen_code", "run_shell_command", "web_fetch")])
def test_the_real_cli_runs_from_its_harness_command(name, tool, web_tool, tiny_model, tools_dir, tmp_path):
    proc, traj, upstream, work, run = run_real_cli(name, tool, tiny_model, tools_dir, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert (work / "target.txt").read_text() == "fixed\n"
    assert traj.raw_ok and traj.final_text == FINAL["content"] and traj.tool_calls == 1 and traj.turns == 2
    assert len(upstream.requests) == 2     # no memory extraction, title or other side request
    assert init_model(proc.stdout) == "agentrl-override"   # the last --model won
    assert [r["sampling_params"]["max_new_tokens"] for r in upstream.requests] == [run.max_new_tokens] * 2
    first, second = (upstream.tokenizer.decode(r["input_ids"]) for r in upstream.requests)
    assert web_tool not in first                           # the enforced flag removed it from the request
    assert "persistent file-based memory" not in first     # Claude Code's memory section is off
    assert TASK in second and TASK not in first            # the task came from PROBLEM_STATEMENT.md


def test_a_dataclass_run_is_per_rollout_not_global():
    a, b = make_run(prompt_style="instruction"), make_run(prompt_style="dataset")
    assert dataclasses.replace(a, prompt_style="dataset") == b
    assert split_prompt(get_harness("builtin").command(b).argv)[1] == b.task_text
    assert split_prompt(get_harness("builtin").command(a).argv)[1] != a.task_text
