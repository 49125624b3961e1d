"""The codex harness: its command, the config.toml it writes, reading `codex exec --json`, and the real
Codex CLI (0.171.0) through the adapter with a scripted model: on the host from the harness's own command,
in a bubblewrap sandbox with the tools directory mounted read-only, and across a turn longer than its
stream idle timeout (the adapter's keepalives)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sandboxed_session import TASK, run_in_bwrap
from scripted_upstream import ScriptedUpstream, assert_one_exact_sample
from test_harness import cli_install_source

from agentrl.adapter.serve import AdapterServer
from agentrl.adapter.service import Adapter, AdapterConfig
from agentrl.harness import PROBLEM_FILE, HarnessRun, get_harness
from agentrl.harness.codex import KEY_ENV, read_codex_json
from agentrl.harness.install import CODEX_BIN

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]


def make_run(**kw) -> HarnessRun:
    base = dict(task_text="Fix the off-by-one in count().", prompt_style="instruction", workdir="/testbed",
                base_url="http://127.0.0.1:8000", api_key="sess-key", model="agentrl-tiny",
                max_new_tokens=16000, max_context=200000)
    return HarnessRun(**{**base, **kw})


def test_the_command_runs_the_native_binary_and_the_config_points_at_the_adapter():
    cmd = get_harness("codex").command(make_run(compact_at=0.5))
    assert cmd.argv[:5] == [f"/opt/agentrl/tools/clis/{CODEX_BIN}", "exec", "--json", "--skip-git-repo-check",
                            "--strict-config"]
    assert cmd.argv[-2] == "--" and PROBLEM_FILE in cmd.argv[-1]
    assert cmd.env == {"HOME": "/home/agent", "CODEX_HOME": "/home/agent/.codex", KEY_ENV: "sess-key"}
    assert "sess-key" not in " ".join(cmd.argv) and b"sess-key" not in cmd.files["/home/agent/.codex/config.toml"]
    config = tomllib.loads(cmd.files["/home/agent/.codex/config.toml"].decode())
    assert config["model_providers"]["agentrl"] == {
        "name": "agentrl adapter", "base_url": "http://127.0.0.1:8000/v1", "env_key": KEY_ENV,
        "wire_api": "responses", "supports_websockets": False}
    assert (config["model"], config["model_provider"]) == ("agentrl-tiny", "agentrl")
    assert (config["model_context_window"], config["model_auto_compact_token_limit"]) == (200000, 100000)
    assert (config["approval_policy"], config["sandbox_mode"]) == ("never", "danger-full-access")
    assert config["web_search"] == "disabled" and config["check_for_update_on_startup"] is False
    assert not any(config["features"].values()) and {"plugins", "remote_plugin", "apps"} <= set(config["features"])
    assert config["skills"]["bundled"]["enabled"] is False
    assert config["analytics"]["enabled"] is False and config["feedback"]["enabled"] is False
    assert config["otel"]["exporter"] == "none" and config["history"]["persistence"] == "none"


def test_a_model_name_with_quotes_stays_one_toml_string():
    cmd = get_harness("codex").command(make_run(model='we"ird\\name ü'))
    assert tomllib.loads(cmd.files["/home/agent/.codex/config.toml"].decode())["model"] == 'we"ird\\name ü'


# `codex exec --json` as 0.171.0 wrote it against the adapter (shortened): a reply of text and a shell call,
# then the answer.
EVENTS = [
    {"type": "thread.started", "thread_id": "t"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "error", "message": "Model metadata not found"}},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": "I will write the file."}},
    {"type": "item.started", "item": {"id": "item_2", "type": "command_execution", "command": "echo hi",
                                      "status": "in_progress"}},
    {"type": "item.completed", "item": {"id": "item_2", "type": "command_execution", "command": "echo hi",
                                        "exit_code": 0, "status": "completed"}},
    {"type": "item.completed", "item": {"id": "item_3", "type": "agent_message", "text": "Done: out.txt holds hi."}},
    {"type": "turn.completed", "usage": {"input_tokens": 18035, "output_tokens": 46}},
]


def jsonl(events) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def test_the_json_events_give_the_final_text_turns_and_tool_calls():
    t = get_harness("codex").read_trajectory(b"noise\n" + jsonl(EVENTS), b"")
    assert (t.final_text, t.turns, t.tool_calls, t.exit_reason, t.raw_ok) == (
        "Done: out.txt holds hi.", 2, 1, "completed", True)
    two_calls = EVENTS[:4] + EVENTS[5:6] * 2 + EVENTS[6:]   # a second call: counted as a reply of its own
    assert read_codex_json(jsonl(two_calls)).turns == 3


def test_a_failed_turn_and_a_cut_output():
    failed = [*EVENTS[:3], {"type": "error", "message": "Reconnecting... 1/5"},
              {"type": "turn.failed", "error": {"message": "stream disconnected"}}]
    t = read_codex_json(jsonl(failed))
    assert (t.final_text, t.turns, t.exit_reason, t.raw_ok) == (None, 0, "failed", True)
    cut = read_codex_json(jsonl(EVENTS[:-1]))
    assert not cut.raw_ok and cut.final_text == "Done: out.txt holds hi." and cut.exit_reason is None
    assert not read_codex_json(b"\xff{not json\n[1]\n").raw_ok


@pytest.fixture(scope="module")
def tools_dir(tmp_path_factory) -> Path:
    """A host tools directory filled by the harness's own install (copied from `make clis`), readable by
    the sandbox's agent user."""
    cli_install_source()
    tools = tmp_path_factory.mktemp("tools")
    tools.chmod(0o755)
    get_harness("codex").install(tools)
    return tools


def shell_call(command: str) -> dict:
    return {"role": "assistant", "content": "I will read the task and fix the file.",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "exec_command",
                                                                        "arguments": {"cmd": command}}}]}


FINAL = {"role": "assistant", "content": "Fixed: target.txt now says fixed."}


def write_files(files: dict[str, bytes]) -> None:
    for path, data in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)


@pytest.mark.integration
def test_a_real_codex_session_from_the_harness_command_is_one_exact_sample(tiny_model, tools_dir, tmp_path):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "target.txt").write_text("bug\n")
    steps = [shell_call(f"cat {PROBLEM_FILE} && echo fixed > target.txt"), FINAL]
    with ScriptedUpstream(tiny_model, steps) as upstream:
        adapter = Adapter(AdapterConfig(tokenizer=tiny_model, upstreams=[upstream.url], max_context=131072,
                                        max_new_tokens=3000))
        with AdapterServer(adapter) as server:
            key = adapter.sessions.open().key
            run = HarnessRun(task_text=TASK, prompt_style="instruction", workdir=str(work), base_url=server.url,
                             api_key=key, model="agentrl-tiny", max_new_tokens=3000, max_context=131072,
                             home=str(home), tools_dir=str(tools_dir), extra_args=("--model", "agentrl-override"))
            harness = get_harness("codex")
            cmd = harness.command(run)
            write_files(cmd.files)
            env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **cmd.env}
            proc = subprocess.run(cmd.argv, cwd=work, env=env, capture_output=True, timeout=300,
                                  stdin=subprocess.DEVNULL)
            result = adapter.sessions.finish(key).to_json()
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert (work / "target.txt").read_text() == "fixed\n"
    traj = harness.read_trajectory(proc.stdout, proc.stderr)
    assert traj.raw_ok and traj.final_text == FINAL["content"] and (traj.turns, traj.tool_calls) == (2, 1)
    assert len(upstream.requests) == 2                  # no title, memory or other side request
    assert [r["sampling_params"]["max_new_tokens"] for r in upstream.requests] == [3000, 3000]   # the adapter's cap
    first, second = (upstream.tokenizer.decode(r["input_ids"]) for r in upstream.requests)
    assert "web_search" not in first and "skills_instructions" not in first and "imagegen" not in first
    assert TASK in second and TASK not in first        # the task came from PROBLEM_STATEMENT.md
    assert_one_exact_sample(result, [upstream.output_ids(s) for s in steps])
    session = next((home / ".codex/sessions").rglob("rollout-*.jsonl"))   # its own record of the session
    assert '"agentrl-override"' in session.read_text()                   # the last --model won


@pytest.mark.integration
def test_a_turn_longer_than_codex_idle_timeout_completes_with_keepalives(tiny_model, tools_dir, tmp_path):
    """Codex gives up on a stream after stream_idle_timeout_ms without an event (300 s by default), then
    sends the turn again. Scaled down: a 1.5 s timeout and a 4 s turn, with keepalives every 0.3 s
    (one request) and without any within the turn (Codex retries: the turn is generated again)."""
    def session(keepalive_s: float) -> tuple[subprocess.CompletedProcess, int, dict]:
        work, home = tmp_path / f"work-{keepalive_s}", tmp_path / f"home-{keepalive_s}"
        work.mkdir()
        home.mkdir()
        steps = [{**FINAL, "delay_s": 4}, FINAL]
        with ScriptedUpstream(tiny_model, steps) as upstream:
            adapter = Adapter(AdapterConfig(tokenizer=tiny_model, upstreams=[upstream.url], max_context=131072,
                                            keepalive_s=keepalive_s))
            with AdapterServer(adapter) as server:
                key = adapter.sessions.open().key
                run = HarnessRun(task_text="Say done.", prompt_style="dataset", workdir=str(work),
                                 base_url=server.url, api_key=key, model="agentrl-tiny", max_new_tokens=3000,
                                 max_context=131072, home=str(home), tools_dir=str(tools_dir),
                                 extra_args=("-c", "model_providers.agentrl.stream_idle_timeout_ms=1500"))
                cmd = get_harness("codex").command(run)
                write_files(cmd.files)
                proc = subprocess.run(cmd.argv, cwd=work, env={"PATH": os.environ["PATH"], **cmd.env},
                                      capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
                result = adapter.sessions.finish(key).to_json()
        return proc, len(upstream.requests), result

    proc, requests, result = session(0.3)
    assert proc.returncode == 0 and requests == 1, proc.stdout[-2000:]
    assert len(result["samples"]) == 1
    proc, requests, result = session(30)
    assert proc.returncode == 0 and requests == 2, proc.stdout[-2000:]   # timed out once, sent again
    assert b"Reconnecting... 1/" in proc.stdout and b"idle timeout" in proc.stdout


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bubblewrap and root")
def test_codex_in_a_sandbox_with_the_tools_mounted_read_only(tiny_model, tools_dir, tmp_path):
    """As the pool runs it: the agent user (uid 1000) in bubblewrap, the host's /usr as the image, the tools
    directory read-only at /opt/agentrl/tools, the adapter through the sandbox's forwarded port."""
    steps = [shell_call(f"cat {PROBLEM_FILE} && echo fixed > target.txt && touch /opt/agentrl/tools/x; id -u"),
             FINAL]
    run = run_in_bwrap("codex", steps, tiny_model, tools_dir, tmp_path)
    proc, target, result = run.proc, run.target, run.result
    assert proc.exit_code == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert target == b"fixed\n"
    outputs = [json.loads(line)["item"].get("aggregated_output", "") for line in proc.stdout.splitlines()
               if line.startswith(b'{"type":"item.completed"') and b"command_execution" in line]
    assert "Read-only file system" in outputs[0] and outputs[0].rstrip().endswith("1000")
    assert get_harness("codex").read_trajectory(proc.stdout, proc.stderr).final_text == FINAL["content"]
    assert_one_exact_sample(result, run.sampled)
