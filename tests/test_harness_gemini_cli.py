"""The gemini_cli harness: its command and settings, reading `--output-format stream-json`, and the real Gemini
CLI (0.61.0) through the adapter's Gemini endpoint with a scripted model: on the host from the harness's own
command (reasoning, a retried turn, a slow turn with keepalives), and in a bubblewrap sandbox with the tools
directory mounted read-only and no network but the adapter's."""

import json
import os
import shutil
from pathlib import Path

import pytest
from sandboxed_session import TASK, installed_tools, make_run, run_in_bwrap, run_on_host
from scripted_upstream import assert_one_exact_sample

from agentrl.harness import PROBLEM_FILE, get_harness
from agentrl.harness.gemini_cli import ASSUMED_WINDOW, WEB_TOOLS, read_gemini_stream_json

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

SETTINGS = "/home/agent/.gemini/settings.json"


def test_the_command_points_gemini_cli_at_the_adapter_and_turns_the_rest_off():
    cmd = get_harness("gemini_cli").command(make_run(compact_at=0.6))
    s = json.loads(cmd.files[SETTINGS])
    assert s["security"]["auth"]["selectedType"] == "gemini-api-key" and s["tools"]["exclude"] == list(WEB_TOOLS)
    assert s["model"]["name"] == "agentrl-tiny" and s["model"]["disableLoopDetection"] is True
    assert round(s["model"]["compressionThreshold"] * ASSUMED_WINDOW) == 120000     # compact_at x max_context
    assert not s["privacy"]["usageStatisticsEnabled"] and not s["telemetry"]["enabled"]
    assert cmd.env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:8000" and cmd.env["GEMINI_API_KEY"] == "sess-key"
    assert cmd.argv[:2] == ["/opt/agentrl/tools/node/bin/node",
                            "/opt/agentrl/tools/clis/node_modules/@google/gemini-cli/bundle/gemini.js"]
    assert "--yolo" in cmd.argv and "-m" not in cmd.argv and "--model" not in cmd.argv
    assert cmd.argv[-1].startswith("--prompt=") and cmd.warnings == []


def jsonl(events: list[dict]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


# As Gemini CLI 0.61.0 wrote them (shortened): a reply of text and a call, its result, the final reply.
EVENTS = [
    {"type": "init", "session_id": "s", "model": "agentrl-tiny"},
    {"type": "message", "role": "user", "content": "Write hi into out.txt."},
    {"type": "message", "role": "assistant", "content": "I will ", "delta": True},
    {"type": "message", "role": "assistant", "content": "write it.", "delta": True},
    {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "t1", "parameters": {"command": "echo hi"}},
    {"type": "tool_result", "tool_id": "t1", "status": "success", "output": ""},
    {"type": "message", "role": "assistant", "content": "Done.", "delta": True},
    {"type": "result", "status": "success", "stats": {"tool_calls": 1}},
]


def test_reading_gemini_stream_json():
    t = read_gemini_stream_json(b"YOLO mode is enabled.\n" + jsonl(EVENTS))
    assert (t.final_text, t.turns, t.tool_calls, t.exit_reason, t.raw_ok) == ("Done.", 2, 1, "success", True)
    assert not read_gemini_stream_json(jsonl(EVENTS[:-1])).raw_ok                 # no result line
    calls_last = read_gemini_stream_json(jsonl([*EVENTS[:6], EVENTS[4], EVENTS[-1]]))    # its last reply a call
    assert (calls_last.final_text, calls_last.turns, calls_last.tool_calls) == (None, 2, 2)
    failed = read_gemini_stream_json(jsonl([*EVENTS[:-1], {"type": "result", "status": "error"}]))
    assert not failed.raw_ok and failed.exit_reason == "error"
    assert not read_gemini_stream_json(b"\xff{not json\n[1]\n").raw_ok


@pytest.fixture(scope="module")
def tools_dir(tmp_path_factory) -> Path:
    return installed_tools(tmp_path_factory, "gemini_cli")


def shell_call(command: str) -> dict:
    return {"role": "assistant", "content": "I will read the task and fix the file.",
            "reasoning_content": "A shell command does it.",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "run_shell_command",
                                                                        "arguments": {"command": command}}}]}


FINAL = {"role": "assistant", "content": "Fixed: target.txt now says fixed.", "reasoning_content": "It worked."}


@pytest.mark.integration
def test_a_real_gemini_cli_session_from_the_harness_command_is_one_exact_sample(tiny_model, tools_dir, tmp_path):
    steps = [shell_call(f"cat {PROBLEM_FILE}; echo fixed > target.txt"), FINAL]
    run = run_on_host("gemini_cli", steps, tiny_model, tools_dir, tmp_path)
    proc, traj, result, upstream, work = run.proc, run.trajectory, run.result, run.upstream, run.work
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert (work / "target.txt").read_text() == "fixed\n"
    assert traj.raw_ok and traj.final_text == FINAL["content"] and (traj.turns, traj.tool_calls) == (2, 1)
    assert len(upstream.requests) == 2                  # no router, loop check or other side request
    first, second = (upstream.tokenizer.decode(r["input_ids"]) for r in upstream.requests)
    assert '"name": "run_shell_command"' in first and not any(f'"name": "{t}"' in first for t in WEB_TOOLS)
    assert TASK in second and TASK not in first         # the task came from PROBLEM_STATEMENT.md
    # It drops thought parts from its history: the reasoning came back in the call's thoughtSignature.
    assert "A shell command does it." in second
    assert_one_exact_sample(result, [upstream.output_ids(s) for s in steps])


@pytest.mark.integration
def test_its_retry_of_a_failed_turn_is_not_a_turn(tiny_model, tools_dir, tmp_path):
    steps = [{"fail": 500}, shell_call("echo fixed > target.txt"), FINAL]
    run = run_on_host("gemini_cli", steps, tiny_model, tools_dir, tmp_path)
    proc, traj, result, upstream, _work = run.proc, run.trajectory, run.result, run.upstream, run.work
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert len(upstream.requests) == 3 and (traj.turns, traj.tool_calls) == (2, 1)
    assert_one_exact_sample(result, [upstream.output_ids(s) for s in steps[1:]])


@pytest.mark.integration
def test_a_slow_turn_with_keepalives_is_one_request(tiny_model, tools_dir, tmp_path):
    """Keepalives every 0.2 s within a 2 s turn. As SSE comments they broke the stream (the SDK's reader
    matched nothing after one; Gemini CLI took the turn for an empty stream and sent it again)."""
    steps = [{**shell_call("echo fixed > target.txt"), "delay_s": 2}, FINAL]
    run = run_on_host("gemini_cli", steps, tiny_model, tools_dir, tmp_path, keepalive_s=0.2)
    proc, _traj, result, upstream, work = run.proc, run.trajectory, run.result, run.upstream, run.work
    assert proc.returncode == 0 and len(upstream.requests) == 2, proc.stdout[-2000:]
    assert (work / "target.txt").read_text() == "fixed\n"
    assert_one_exact_sample(result, [upstream.output_ids(s) for s in steps])


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bubblewrap and root")
def test_gemini_cli_in_a_sandbox_with_the_tools_mounted_read_only(tiny_model, tools_dir, tmp_path):
    """As the pool runs it: the agent user (uid 1000) in bubblewrap, the host's /usr as the image, the tools
    directory read-only at /opt/agentrl/tools, no network but the adapter through the forwarded port."""
    steps = [shell_call(f"cat {PROBLEM_FILE} && echo fixed > target.txt && touch /opt/agentrl/tools/x; id -u"),
             FINAL]
    run = run_in_bwrap("gemini_cli", steps, tiny_model, tools_dir, tmp_path)
    proc, target, result = run.proc, run.target, run.result
    assert proc.exit_code == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert target == b"fixed\n"
    [output] = [json.loads(line)["output"] for line in proc.stdout.splitlines()
                if line.startswith(b'{"type":"tool_result"')]
    assert "Read-only file system" in output and "1000" in output
    assert get_harness("gemini_cli").read_trajectory(proc.stdout, proc.stderr).final_text == FINAL["content"]
    assert_one_exact_sample(result, run.sampled)
