"""The opencode harness: its command and the config it writes, reading `opencode run --format json`, and the
real OpenCode CLI (1.18.33) through the adapter with a scripted model: on the host from the harness's own
command, and in a bubblewrap sandbox with the tools directory mounted read-only and no network but the
adapter's."""

import json
import os
import shutil
from pathlib import Path

import pytest
from sandboxed_session import TASK, HostSession, installed_tools, make_run, run_in_bwrap, run_on_host
from scripted_upstream import assert_one_exact_sample

from agentrl.harness import PROBLEM_FILE, get_harness
from agentrl.harness.opencode import WEB_TOOLS, fires_at, read_opencode_json

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

CONFIG = "/home/agent/.config/opencode/opencode.json"


def test_the_command_points_a_custom_provider_at_the_adapter_and_turns_the_rest_off():
    cmd = get_harness("opencode").command(make_run(max_context=65536, max_new_tokens=4096))
    config = json.loads(cmd.files[CONFIG])
    provider = config["provider"]["agentrl"]
    assert provider["options"] == {"baseURL": "http://127.0.0.1:8000/v1", "apiKey": "sess-key"}
    assert provider["models"]["agentrl-tiny"]["limit"] == {"context": 65536, "output": 4096}
    assert config["model"] == "agentrl/agentrl-tiny" and config["autoupdate"] is False
    assert {t: config["permission"][t] for t in WEB_TOOLS} == dict.fromkeys(WEB_TOOLS, "deny")
    assert cmd.env["OPENCODE_CONFIG"] == CONFIG and cmd.env["HOME"] == "/home/agent"
    for off in ("MODELS_FETCH", "PRUNE", "PROJECT_CONFIG", "DEFAULT_PLUGINS", "AUTOUPDATE"):
        assert cmd.env[f"OPENCODE_DISABLE_{off}"] == "1"
    argv = cmd.argv
    assert argv[0].startswith("/opt/agentrl/tools/clis/node_modules/opencode-linux-") and argv[0].endswith("/opencode")
    assert argv[1:argv.index("--")] == ["run", "--format", "json", "--pure", "--auto", "--title",
                                           "agentrl"]
    assert "--model" not in argv        # a repeated --model crashes OpenCode (an array): extra_args may add one


def test_compaction_fires_where_opencode_reserves_the_output():
    assert fires_at(make_run(max_context=200000, max_new_tokens=16000)) == 184000
    assert fires_at(make_run(max_context=200000, max_new_tokens=64000)) == 168000     # its reserve caps at 32000
    assert get_harness("opencode").command(make_run(compact_at=0.6)).warnings == []


def jsonl(events: list[dict]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


# As OpenCode 1.18.33 wrote them (shortened): a step with a text and a tool call, then the final step.
EVENTS = [
    {"type": "step_start", "part": {"type": "step-start"}},
    {"type": "text", "part": {"type": "text", "text": "I will write the file."}},
    {"type": "tool_use", "part": {"type": "tool", "tool": "bash", "state": {"status": "completed",
                                                                           "input": {"command": "echo hi"}}}},
    {"type": "step_finish", "part": {"type": "step-finish", "reason": "tool-calls"}},
    {"type": "step_start", "part": {"type": "step-start"}},
    {"type": "text", "part": {"type": "text", "text": "Done: out.txt holds hi."}},
    {"type": "step_finish", "part": {"type": "step-finish", "reason": "stop"}},
]


def test_reading_opencode_json():
    t = read_opencode_json(b"some log line\n" + jsonl(EVENTS))
    assert (t.final_text, t.turns, t.tool_calls, t.exit_reason, t.raw_ok) == ("Done: out.txt holds hi.", 2, 1,
                                                                              "stop", True)
    assert not read_opencode_json(jsonl(EVENTS[:3])).raw_ok                    # no step finished
    failed = read_opencode_json(jsonl([*EVENTS, {"type": "error", "error": {"name": "APIError"}}]))
    assert not failed.raw_ok and failed.exit_reason == "error"
    assert not read_opencode_json(b"\xff{not json\n[1]\n").raw_ok


@pytest.fixture(scope="module")
def tools_dir(tmp_path_factory) -> Path:
    return installed_tools(tmp_path_factory, "opencode")


def shell_call(command: str) -> dict:
    return {"role": "assistant", "content": "I will read the task and fix the file.",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "bash", "arguments": {
                "command": command, "description": "fix target.txt"}}}]}


FINAL = {"role": "assistant", "content": "Fixed: target.txt now says fixed."}


def host_session(tiny_model, tools_dir: Path, tmp_path: Path, steps: list, *, provider_options: dict | None = None,
                 **kw) -> HostSession:
    """run_on_host with the task's own opencode.json beside it (never read: it names another model), and
    `provider_options` added to the provider the harness wrote."""
    def prepare(work: Path, env: dict[str, str]) -> None:
        (work / "opencode.json").write_text(json.dumps({"model": "elsewhere/model"}))
        if provider_options:
            config = json.loads(Path(env["OPENCODE_CONFIG"]).read_text())
            config["provider"]["agentrl"]["options"].update(provider_options)
            Path(env["OPENCODE_CONFIG"]).write_text(json.dumps(config))
    return run_on_host("opencode", steps, tiny_model, tools_dir, tmp_path, prepare=prepare, **kw)


@pytest.mark.integration
@pytest.mark.parametrize("style", ["instruction", "dataset"])
def test_a_real_opencode_session_from_the_harness_command_is_one_exact_sample(style, tiny_model, tools_dir,
                                                                            tmp_path):
    task = TASK if style == "instruction" else f"- {TASK}"       # a dataset text that looks like a flag
    steps = [shell_call(f"cat {PROBLEM_FILE}; echo fixed > target.txt"), FINAL]
    run = host_session(tiny_model, tools_dir, tmp_path, steps, task=task, style=style)
    proc, traj, result, upstream, work = run.proc, run.trajectory, run.result, run.upstream, run.work
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert (work / "target.txt").read_text() == "fixed\n"
    assert traj.raw_ok and traj.final_text == FINAL["content"] and (traj.turns, traj.tool_calls) == (2, 1)
    assert len(upstream.requests) == 2                  # no title or other side request
    assert [r["sampling_params"]["max_new_tokens"] for r in upstream.requests] == [3000, 3000]
    first, second = (upstream.tokenizer.decode(r["input_ids"]) for r in upstream.requests)
    assert '"name": "bash"' in first and not any(f'"name": "{t}"' in first for t in WEB_TOOLS)
    if style == "instruction":
        assert TASK in second and TASK not in first     # the task came from PROBLEM_STATEMENT.md
    else:
        assert task in first                            # verbatim, after `--`
    assert_one_exact_sample(result, [upstream.output_ids(s) for s in steps])


@pytest.mark.integration
def test_its_retry_of_a_failed_turn_is_not_a_turn(tiny_model, tools_dir, tmp_path):
    """The model server fails once: the adapter answers 503, OpenCode sends the turn again, and the
    session is still one sample with each turn once."""
    steps = [{"fail": 500}, shell_call("echo fixed > target.txt"), FINAL]
    run = host_session(tiny_model, tools_dir, tmp_path, steps)
    proc, traj, result, upstream, work = run.proc, run.trajectory, run.result, run.upstream, run.work
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert len(upstream.requests) == 3 and (traj.turns, traj.tool_calls) == (2, 1)
    assert (work / "target.txt").read_text() == "fixed\n"
    assert_one_exact_sample(result, [upstream.output_ids(s) for s in steps[1:]])


@pytest.mark.integration
@pytest.mark.parametrize("keepalive_s", [0.3, 30])
def test_a_turn_longer_than_its_chunk_timeout_completes_with_keepalives(keepalive_s, tiny_model, tools_dir,
                                                                         tmp_path):
    """OpenCode gives up on a stream that sends nothing for `chunkTimeout` ms (a provider option, 300 s by
    default). Scaled down: 2 s against a 4 s turn. With the adapter's keepalives every 0.3 s the turn is one
    request and the session one sample; without any within the turn, OpenCode drops the stream and sends the
    turn again: two requests, and still one sample (the dropped turn is not recorded)."""
    steps = [{**FINAL, "delay_s": 4}, FINAL]
    run = host_session(tiny_model, tools_dir, tmp_path, steps, task="Say done.", style="dataset",
                       provider_options={"chunkTimeout": 2000}, keepalive_s=keepalive_s)
    proc, traj, result, upstream = run.proc, run.trajectory, run.result, run.upstream
    assert proc.returncode == 0 and traj.final_text == FINAL["content"], proc.stdout[-2000:]
    assert len(upstream.requests) == (1 if keepalive_s < 2 else 2)
    assert_one_exact_sample(result, [upstream.output_ids(FINAL)])


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bubblewrap and root")
def test_opencode_in_a_sandbox_with_the_tools_mounted_read_only(tiny_model, tools_dir, tmp_path):
    """As the pool runs it: the agent user (uid 1000) in bubblewrap, the host's /usr as the image, the tools
    directory read-only at /opt/agentrl/tools, no network but the adapter through the forwarded port."""
    steps = [shell_call(f"cat {PROBLEM_FILE} && echo fixed > target.txt && touch /opt/agentrl/tools/x; id -u"),
             FINAL]
    run = run_in_bwrap("opencode", steps, tiny_model, tools_dir, tmp_path)
    proc, target, result = run.proc, run.target, run.result
    assert proc.exit_code == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert target == b"fixed\n"
    [tool] = [json.loads(line)["part"] for line in proc.stdout.splitlines() if line.startswith(b'{"type":"tool_use"')]
    output = tool["state"]["output"]
    assert "Read-only file system" in output and "1000\n" in output     # stderr and stdout, in either order
    assert get_harness("opencode").read_trajectory(proc.stdout, proc.stderr).final_text == FINAL["content"]
    assert_one_exact_sample(result, run.sampled)
