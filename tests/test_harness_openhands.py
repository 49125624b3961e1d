"""The openhands harness: its command and config, the launcher's summary of a conversation, and the real
OpenHands SDK (1.58.2, on the Python 3.12 bundled in the tools directory) through the adapter with a scripted
model: on the host from the harness's own command, and in a bubblewrap sandbox with the tools directory
mounted read-only and no network but the adapter's."""

import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from ci import skip_or_fail
from sandboxed_session import TASK, make_run, run_in_bwrap, run_on_host
from scripted_upstream import assert_one_exact_sample

from agentrl.harness import PROBLEM_FILE, get_harness, openhands_run
from agentrl.harness.base import HarnessInstallError
from agentrl.harness.openhands import MIN_PYTHON, TOOL, VERSION
from agentrl.harness.python_tool import find_python

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

CONFIG = "/home/agent/.config/agentrl-openhands.json"
OFFERED = {"terminal", "file_editor", "finish", "think"}     # the two tools and the SDK's own: no browser


def test_the_command_runs_the_bundled_python_at_the_adapter_with_the_session_key():
    cmd = get_harness("openhands").command(make_run(max_context=65536, max_new_tokens=4096,
                                                    extra_args=("--max-iterations", "30")))
    root = "/opt/agentrl/tools/openhands"
    assert cmd.argv[:cmd.argv.index("--")] == [f"{root}/python/bin/python3", "-I", "-S",
                                                f"{root}/agentrl_openhands.py", CONFIG, "--max-iterations", "30"]
    assert cmd.argv[-2] == "--" and PROBLEM_FILE in cmd.argv[-1]
    assert json.loads(cmd.files[CONFIG]) == {"model": "agentrl-tiny", "base_url": "http://127.0.0.1:8000/v1",
                                             "max_input_tokens": 65536, "max_output_tokens": 4096,
                                             "timeout_s": 3600, "max_iterations": 1_000_000}
    assert cmd.env == {"HOME": "/home/agent", "LD_LIBRARY_PATH": f"{root}/python/lib",
                       "OPENHANDS_LLM_API_KEY": "sess-key"}
    assert any("no compaction trigger" in w for w in cmd.warnings)     # no condenser: it would fork the chain


def event(kind: str, **fields) -> object:
    return type(kind, (), fields)()


def test_the_summary_counts_calls_and_takes_the_finish_message():
    finish = type("FinishAction", (), {"message": "Fixed target.txt."})()
    events = [event("MessageEvent", source="user", llm_message=SimpleNamespace(content=[SimpleNamespace(text="task")])),
              event("ActionEvent", action=type("TerminalAction", (), {"command": "ls"})()),
              event("ObservationEvent"),
              event("MessageEvent", source="agent", llm_message=SimpleNamespace(content=[SimpleNamespace(text="hm")])),
              event("ActionEvent", action=finish)]
    assert openhands_run.summary(events, 3, "finished") == {"final_text": "Fixed target.txt.", "turns": 3,
                                                            "tool_calls": 2, "exit_reason": "finished"}
    assert openhands_run.summary(events[:4], 2, "stuck")["final_text"] == "hm"
    assert openhands_run.summary([], 0, "error")["final_text"] is None


def test_the_launcher_refuses_a_command_line_without_a_task_or_a_key(monkeypatch, capsys):
    monkeypatch.delenv(openhands_run.KEY_ENV, raising=False)
    assert openhands_run.main(["config.json", "--", "task"]) == 64
    monkeypatch.setenv(openhands_run.KEY_ENV, "k")
    assert openhands_run.main(["config.json", "task"]) == 64
    assert openhands_run.main(["config.json", "--max-iterations", "--", "task"]) == 64
    assert openhands_run.main(["config.json", "max-iterations", "3", "--", "task"]) == 64
    assert "CONFIG [--KEY VALUE ...] -- TASK" in capsys.readouterr().err
    assert [openhands_run.json_or_text(v) for v in ("30", "agentrl-tiny", '"30"')] == [30, "agentrl-tiny", "30"]


def test_no_python_new_enough_is_refused_naming_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(HarnessInstallError, match=r"OpenHands \(openhands-sdk 1.58.2\) needs Python 3.12 or newer, "
                                                  r"and none was found .*pyenv install 3.12"):
        find_python(MIN_PYTHON, f"OpenHands (openhands-sdk {VERSION})")


def require_openhands() -> None:
    """Skip where this machine has no Python 3.12 to run OpenHands; else the checkout's build must run."""
    try:
        TOOL.interpreter()
    except HarnessInstallError as e:        # this machine cannot run OpenHands at all
        pytest.skip(str(e))
    if not TOOL.ready(TOOL.checkout):
        skip_or_fail("the OpenHands harness tests", f"{TOOL.checkout} does not run openhands-sdk {VERSION}: "
                                                    f"run `make clis`")


@pytest.fixture(scope="module")
def tools_dir() -> Path:
    """The checkout's `make clis` tree itself: copying its 0.5 GB into a tools directory of the test's own is
    what test_harness_mini_swe_agent.py tests of the same install code (python_tool.PythonTool)."""
    require_openhands()
    return TOOL.checkout.parent


def terminal(command: str) -> dict:
    return {"role": "assistant", "content": "I will read the task and fix the file.",
            "reasoning_content": "A shell command does it.",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "terminal", "arguments": {
                "command": command}}}]}


FINISH = {"role": "assistant", "content": "Done.", "reasoning_content": "It says fixed now.",
          "tool_calls": [{"id": "y", "type": "function", "function": {"name": "finish", "arguments": {
              "message": "Fixed: target.txt now says fixed."}}}]}


@pytest.mark.integration
def test_a_real_openhands_session_from_the_harness_command_is_one_exact_sample(tiny_model, tools_dir, tmp_path):
    """A slow first turn (2 s) included: OpenHands asks without streaming, so no keepalive holds a turn, and its
    read timeout (the harness sets 3600 s, the SDK's default is 300 s) is what a slow model must beat."""
    steps = [{**terminal(f"cat {PROBLEM_FILE}; echo key:${{OPENHANDS_LLM_API_KEY:-none}}"), "delay_s": 2},
             terminal("echo fixed > target.txt"), FINISH]
    run = run_on_host("openhands", steps, tiny_model, tools_dir, tmp_path)
    proc, traj, result, upstream, work = run.proc, run.trajectory, run.result, run.upstream, run.work
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert (work / "target.txt").read_text() == "fixed\n"
    assert traj.raw_ok and traj.final_text == "Fixed: target.txt now says fixed."
    assert (traj.turns, traj.tool_calls, traj.exit_reason) == (3, 3, "finished")
    assert len(upstream.requests) == 3                   # each turn once: the slow one too
    assert [r["sampling_params"]["max_new_tokens"] for r in upstream.requests] == [3000] * 3
    first, second = (upstream.tokenizer.decode(r["input_ids"]) for r in upstream.requests[:2])
    assert set(re.findall(r'"function", "function": \{"name": "(\w+)"', first)) == OFFERED
    assert TASK in second and TASK not in first          # the task came from PROBLEM_STATEMENT.md
    assert "key:none" in second                          # the launcher took the session key out of the shell's env
    assert_one_exact_sample(result, [upstream.output_ids(s) for s in steps])


@pytest.mark.integration
def test_its_retry_of_a_failed_turn_is_not_a_turn(tiny_model, tools_dir, tmp_path):
    """The model server fails once: the adapter answers 503, litellm sends the turn again (after the SDK's
    8 s wait), and the session is still one sample with each turn once."""
    steps = [{"fail": 500}, terminal("echo fixed > target.txt"), FINISH]
    run = run_on_host("openhands", steps, tiny_model, tools_dir, tmp_path)
    proc, traj, result, upstream, work = run.proc, run.trajectory, run.result, run.upstream, run.work
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert len(upstream.requests) == 3 and (traj.turns, traj.tool_calls) == (2, 2)
    assert (work / "target.txt").read_text() == "fixed\n"
    assert_one_exact_sample(result, [upstream.output_ids(s) for s in steps[1:]])


@pytest.mark.integration
def test_a_turn_longer_than_its_request_timeout_is_sent_again_and_trained_once(tiny_model, tools_dir, tmp_path):
    """Scaled down: a 4 s turn against a 2 s timeout. litellm gives up, the SDK sends the turn again, and the
    session is still one sample (the abandoned turn is not recorded)."""
    def prepare(work: Path, env: dict[str, str]) -> None:
        config = Path(env["HOME"]) / ".config/agentrl-openhands.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "timeout_s": 2}))
    steps = [{**FINISH, "delay_s": 4}, FINISH]
    run = run_on_host("openhands", steps, tiny_model, tools_dir, tmp_path, task="Say done.", style="dataset",
                      prepare=prepare)
    proc, traj, result, upstream = run.proc, run.trajectory, run.result, run.upstream
    assert proc.returncode == 0 and traj.exit_reason == "finished", proc.stderr[-3000:]
    assert len(upstream.requests) == 2
    assert_one_exact_sample(result, [upstream.output_ids(FINISH)])


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bubblewrap and root")
def test_openhands_in_a_sandbox_with_the_tools_mounted_read_only(tiny_model, tools_dir, tmp_path):
    """As the pool runs it: the agent user (uid 1000) in bubblewrap, the host's /usr as the image, the tools
    directory read-only at /opt/agentrl/tools, no network but the adapter through the forwarded port."""
    steps = [terminal(f"cat {PROBLEM_FILE} && echo fixed > target.txt && touch /opt/agentrl/tools/x; id -u"),
             FINISH]
    run = run_in_bwrap("openhands", steps, tiny_model, tools_dir, tmp_path)
    proc, target, result = run.proc, run.target, run.result
    assert proc.exit_code == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert target == b"fixed\n"
    observation = run.prompts[1]
    assert "Read-only file system" in observation and "1000" in observation
    trajectory = get_harness("openhands").read_trajectory(proc.stdout, proc.stderr)
    assert trajectory.final_text == "Fixed: target.txt now says fixed." and trajectory.exit_reason == "finished"
    assert_one_exact_sample(result, run.sampled)
