"""The mini-swe-agent harnesses (tool calls and text-based): the command and config they write, the launcher
and its summary line, the install into a tools directory, and real mini-swe-agent 2.4.6 sessions through
the adapter with a scripted model: one exact sample per session, a format error as two samples that train
every sampled token once, and a session in a bubblewrap sandbox on the bundled Python."""

import http.server
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from ci import skip_or_fail
from sandboxed_session import TASK, run_in_bwrap
from scripted_upstream import ScriptedUpstream, logprob

from agentrl.adapter.serve import AdapterServer
from agentrl.adapter.service import Adapter, AdapterConfig
from agentrl.harness import PROBLEM_FILE, HarnessInstallError, HarnessRun, get_harness, mini_swe_agent_run
from agentrl.harness.mini_swe_agent import CHECKOUT_MINI, SUBMIT, TOOL, VERSION

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

HARNESS = {"toolcall": "mini_swe_agent", "text": "mini_swe_agent_text"}


def make_run(**kw) -> HarnessRun:
    base = dict(task_text="Fix the off-by-one in count().", prompt_style="instruction", workdir="/testbed",
                base_url="http://127.0.0.1:8000", api_key="sess-key", model="agentrl-tiny",
                max_new_tokens=16000, max_context=200000)
    return HarnessRun(**{**base, **kw})


@pytest.mark.parametrize("fmt, builtin, model_class", [
    ("toolcall", "mini.yaml", "agentrl_mini_model.AdapterModel"),
    ("text", "mini_textbased.yaml", "agentrl_mini_model.AdapterTextbasedModel")])
def test_the_command_layers_our_config_over_mini_own(fmt, builtin, model_class):
    cmd = get_harness(HARNESS[fmt]).command(make_run(max_new_tokens=1234))
    root = "/opt/agentrl/tools/mini-swe-agent"
    ours = "/home/agent/.config/mini-swe-agent/agentrl.yaml"
    assert cmd.argv[:-2] == [f"{root}/python/bin/python3", "-I", "-S", f"{root}/agentrl_mini.py",
                             "-c", builtin, "-c", ours]
    assert cmd.argv[-2] == "--" and PROBLEM_FILE in cmd.argv[-1]
    assert cmd.env["OPENAI_API_KEY"] == "sess-key" and cmd.env["LD_LIBRARY_PATH"] == f"{root}/python/lib"
    assert cmd.env["MSWEA_CONFIGURED"] == "1"
    config = json.loads(cmd.files[ours])
    assert config["agent"] == {"mode": "yolo", "confirm_exit": False, "cost_limit": 0}
    assert config["model"]["model_class"] == model_class and config["model"]["model_name"] == "agentrl-tiny"
    assert config["model"]["cost_tracking"] == "ignore_errors"
    assert config["model"]["api_url"] == "http://127.0.0.1:8000/v1/chat/completions"
    assert config["model"]["model_kwargs"] == {"max_tokens": 1234}
    assert config["environment"]["environment_class"] == "local"
    assert any("no compaction trigger" in w for w in cmd.warnings)


def test_the_summary_line_is_read_and_anything_else_is_unreadable():
    harness = get_harness("mini_swe_agent")
    line = json.dumps({"final_text": "Done.", "turns": 3, "tool_calls": 2, "exit_reason": "Submitted"}).encode()
    t = harness.read_trajectory(b"mini-swe-agent (step 1):\n" + line + b"\n", b"")
    assert (t.final_text, t.turns, t.tool_calls, t.exit_reason, t.raw_ok) == ("Done.", 3, 2, "Submitted", True)
    for bad in (b"", b"not json", b'{"final_text": "x"}', b'{"final_text": 1, "turns": 0, "tool_calls": 0, '
                                                           b'"exit_reason": null}'):
        assert not harness.read_trajectory(bad, b"").raw_ok


def test_the_launcher_takes_its_libraries_out_of_the_agents_environment(monkeypatch):
    lib = mini_swe_agent_run.LIB
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{lib}:/image/lib")
    mini_swe_agent_run.restore_library_path()
    assert os.environ["LD_LIBRARY_PATH"] == "/image/lib"
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{lib}/")
    mini_swe_agent_run.restore_library_path()
    assert "LD_LIBRARY_PATH" not in os.environ


def test_the_launcher_summary_of_an_agent():
    class Agent:
        n_calls = 3
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"},
                    {"role": "assistant", "content": "run", "extra": {"actions": [{"command": "ls"}]}},
                    {"role": "user", "content": "Format error"},
                    {"role": "assistant", "content": [{"type": "text", "text": "sub"}, {"type": "text", "text": "mit"}],
                     "extra": {"actions": [{"command": f"echo {SUBMIT}"}]}},
                    {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}}]
    assert mini_swe_agent_run.summary(Agent()) == {"final_text": "submit", "turns": 3, "tool_calls": 2,
                                                   "exit_reason": "Submitted"}


def test_an_install_without_a_package_index_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(HarnessInstallError, match=r"pip could not install mini-swe-agent==2.4.6 into .*dest "
                                                  r"\(it needs PyPI or a pip index\)"):
        TOOL.pip_install(tmp_path / "site", tmp_path / "dest")


@pytest.fixture(scope="module")
def tools_dir(tmp_path_factory) -> Path:
    """A tools directory filled by the harness's own install (a copy of `make clis`'s build)."""
    if not TOOL.ready(CHECKOUT_MINI):
        problem = f"{CHECKOUT_MINI} does not run mini-swe-agent {VERSION}: run `make clis`"
        skip_or_fail("the agent CLI tests", problem)
    tools = tmp_path_factory.mktemp("tools")
    tools.chmod(0o755)     # the sandbox's agent (uid 1000) enters it
    get_harness("mini_swe_agent").install(tools)
    return tools


@pytest.mark.integration
def test_install_is_idempotent_and_relocatable(tools_dir):
    inode = (tools_dir / "mini-swe-agent").stat().st_ino
    TOOL.install(tools_dir)
    assert (tools_dir / "mini-swe-agent").stat().st_ino == inode       # already right: nothing is redone
    model = tools_dir / "mini-swe-agent/site/agentrl_mini_model.py"
    ours = model.read_bytes()
    model.write_bytes(b"# an older checkout's\n")
    assert not TOOL.ready(tools_dir / "mini-swe-agent")
    TOOL.install(tools_dir)        # our own files are rewritten, mini is not built again
    assert model.read_bytes() == ours and (tools_dir / "mini-swe-agent").stat().st_ino == inode
    moved = tools_dir / "elsewhere"
    (tools_dir / "mini-swe-agent").rename(moved)
    try:
        assert TOOL.ready(moved)       # no absolute path inside: it runs wherever it is mounted
    finally:
        moved.rename(tools_dir / "mini-swe-agent")


class Refusing(http.server.BaseHTTPRequestHandler):
    """A model server that answers every call with the class's status."""
    status = 400
    calls: list[tuple[str, dict, dict]] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).calls.append((self.path, dict(self.headers), body))
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": {"message": "refused", "type": "invalid_request_error"}}')

    def log_message(self, *args):
        pass


@pytest.mark.integration
@pytest.mark.parametrize("status, calls, error", [(400, 1, "AdapterRequestError"), (413, 1, "AdapterRequestError"),
                                                  (503, 2, "OpenRouterAPIError"), (429, 2, "OpenRouterAPIError")])
def test_a_refused_request_ends_the_run_and_an_overloaded_server_is_retried(status, calls, error, tools_dir,
                                                                            tmp_path):
    """The model classes (agentrl_mini_model.py): a client error cannot succeed on retry and ends the run at
    once; an overload or a server error goes through mini's own retries (2 tries here, one 4 s wait)."""
    handler = type("Handler", (Refusing,), {"status": status, "calls": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run = HarnessRun(task_text=TASK, prompt_style="instruction", workdir=str(tmp_path),
                         base_url=f"http://127.0.0.1:{server.server_port}", api_key="sess-key", model="agentrl-tiny",
                         max_new_tokens=77, max_context=131072, home=str(tmp_path / "home"), tools_dir=str(tools_dir))
        cmd = get_harness("mini_swe_agent_text").command(run)
        for path, data in cmd.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_bytes(data)
        env = {"PATH": os.environ["PATH"], "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2", **cmd.env}
        proc = subprocess.run(cmd.argv, cwd=tmp_path, env=env, capture_output=True, timeout=120,
                              stdin=subprocess.DEVNULL)
    finally:
        server.shutdown()
    assert proc.returncode == 1 and f"mini-swe-agent failed: {error}: HTTP {status}" in proc.stderr.decode()
    assert len(handler.calls) == calls
    path, headers, body = handler.calls[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer sess-key"
    assert body["model"] == "agentrl-tiny" and body["max_tokens"] == 77 and "tools" not in body
    assert body["messages"][0]["role"] == "system"


def action(fmt: str, command: str) -> dict:
    if fmt == "text":
        return {"role": "assistant", "content": f"THOUGHT: I will run it.\n\n```mswea_bash_command\n{command}\n```"}
    return {"role": "assistant", "content": "I will run it.", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "bash", "arguments": {"command": command}}}]}


def trained(sample: dict) -> list[tuple[int, float]]:
    response = sample["tokens"][sample["prompt_length"]:]
    return [(t, lp) for t, m, lp in zip(response, sample["loss_mask"], sample["rollout_log_probs"], strict=True) if m]


def sampled(ids: list[list[int]]) -> list[tuple[int, float]]:
    return [(t, logprob(i, t)) for turn in ids for i, t in enumerate(turn)]


def session(harness_name, steps, tiny_model, tools_dir, tmp_path, **run_kw):
    """The harness's own command against the adapter, on the host (sandbox paths are host paths here)."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "target.txt").write_text("bug\n")
    with ScriptedUpstream(tiny_model, steps) as upstream:
        adapter = Adapter(AdapterConfig(tokenizer=tiny_model, upstreams=[upstream.url], max_context=131072))
        with AdapterServer(adapter) as server:
            key = adapter.sessions.open().key
            run = HarnessRun(**{**dict(task_text=TASK, prompt_style="instruction", workdir=str(work),
                                       base_url=server.url, api_key=key, model="agentrl-tiny", max_new_tokens=3000,
                                       max_context=131072, home=str(home), tools_dir=str(tools_dir)), **run_kw})
            cmd = get_harness(harness_name).command(run)
            for path, data in cmd.files.items():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_bytes(data)
            proc = subprocess.run(cmd.argv, cwd=work, env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **cmd.env},
                                  capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
            result = adapter.sessions.finish(key).to_json()
    ids = [upstream.output_ids(s) for s in steps]
    prompts = [upstream.tokenizer.decode(r["input_ids"]) for r in upstream.requests]
    return proc, get_harness(harness_name).read_trajectory(proc.stdout, proc.stderr), result, ids, prompts, work, home


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["toolcall", "text"])
def test_a_real_session_is_one_exact_sample(fmt, tiny_model, tools_dir, tmp_path):
    steps = [action(fmt, f"cat {PROBLEM_FILE} && echo fixed > target.txt"), action(fmt, f"echo {SUBMIT}")]
    proc, traj, result, ids, prompts, work, home = session(
        HARNESS[fmt], steps, tiny_model, tools_dir, tmp_path, extra_args=("--model", "openai/agentrl-override"))
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert (work / "target.txt").read_text() == "fixed\n"
    assert traj.raw_ok and (traj.turns, traj.tool_calls, traj.exit_reason) == (2, 2, "Submitted")
    assert traj.final_text == ("I will run it." if fmt == "toolcall" else steps[1]["content"])
    assert len(prompts) == 2 and TASK in prompts[1] and TASK not in prompts[0]   # read from PROBLEM_STATEMENT.md
    assert len(result["samples"]) == 1, result["stats"]
    assert trained(result["samples"][0]) == sampled(ids)
    assert result["stats"]["drift"] == {"root": 1, "clean": 1, "realign": 0, "fork": 0}
    record = json.loads((home / ".config/mini-swe-agent/last_mini_run.traj.json").read_text())
    assert record["info"]["config"]["model"]["model_name"] == "openai/agentrl-override"   # the last --model won


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["toolcall", "text"])
def test_a_format_error_forks_into_two_samples_that_train_every_token_once(fmt, tiny_model, tools_dir, tmp_path):
    """mini drops a reply without exactly one action from its history and sends its format error instead:
    the bad reply is a sample of its own (prompt + reply), the session goes on as the second."""
    steps = [{"role": "assistant", "content": "Let me just think."},
             action(fmt, "echo fixed > target.txt"), action(fmt, f"echo {SUBMIT}")]
    proc, traj, result, ids, prompts, work, _ = session(HARNESS[fmt], steps, tiny_model, tools_dir, tmp_path,
                                                        prompt_style="dataset")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert (traj.turns, traj.tool_calls, traj.exit_reason) == (3, 2, "Submitted")
    assert "Let me just think." not in prompts[1]
    assert ("Format error" if fmt == "text" else "No tool calls found") in prompts[1]
    orphan, main = sorted(result["samples"], key=lambda s: len(trained(s)))
    assert trained(orphan) == sampled(ids[:1]) and trained(main) == sampled(ids[1:])
    assert result["stats"]["drift"] == {"root": 1, "clean": 1, "realign": 0, "fork": 1}


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bubblewrap and root")
def test_mini_swe_agent_in_a_sandbox_runs_on_its_bundled_python(tiny_model, tools_dir, tmp_path):
    """The pool's way: the agent user in bubblewrap, the tools directory read-only at /opt/agentrl/tools
    (another path than where it was built), the adapter through the sandbox's forwarded port."""
    probe = 'echo fixed > target.txt; echo "ld=${LD_LIBRARY_PATH:-unset}"; id -u'
    steps = [action("toolcall", probe), action("toolcall", f"echo {SUBMIT}")]
    run = run_in_bwrap("mini_swe_agent", steps, tiny_model, tools_dir, tmp_path)
    proc, target, result, prompts = run.proc, run.target, run.result, run.prompts
    assert proc.exit_code == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert target == b"fixed\n"
    assert "ld=unset" in prompts[1] and "1000" in prompts[1]   # the agent's commands never see our libraries
    assert get_harness("mini_swe_agent").read_trajectory(proc.stdout, proc.stderr).exit_reason == "Submitted"
    assert len(result["samples"]) == 1 and trained(result["samples"][0]) == sampled(run.sampled)
