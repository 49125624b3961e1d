"""The built-in agent: end to end through the adapter with a scripted model, its retries, its shell, and
reading its summary line back."""

import ast
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path

import pytest
from scripted_upstream import ScriptedUpstream, logprob

from agentrl.adapter.serve import AdapterServer
from agentrl.adapter.service import Adapter, AdapterConfig
from agentrl.harness import HarnessRun, get_harness
from agentrl.harness import builtin_agent as agent

pytestmark = pytest.mark.integration

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

BUILTIN = get_harness("builtin")


@pytest.fixture(scope="module")
def tools_dir(tmp_path_factory) -> Path:
    tools = tmp_path_factory.mktemp("tools")
    BUILTIN.install(tools)
    return tools


def run_builtin(tools_dir: Path, work: Path, base_url: str, key: str, *, task: str = "Fix greeting.txt.",
                extra_args: tuple[str, ...] = (), max_new_tokens: int = 512) -> subprocess.CompletedProcess:
    run = HarnessRun(task_text=task, prompt_style="dataset", workdir=str(work), base_url=base_url, api_key=key,
                     model="agentrl-tiny", max_new_tokens=max_new_tokens, max_context=131072,
                     home=str(work.parent), tools_dir=str(tools_dir), extra_args=extra_args)
    cmd = BUILTIN.command(run)
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **cmd.env}
    return subprocess.run(cmd.argv, cwd=work, env=env, capture_output=True, timeout=120)


def bash_call(command: str) -> dict:
    return {"role": "assistant", "content": "", "reasoning_content": "The file says hullo; fix it.",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "bash",
                                                                      "arguments": {"command": command}}}]}


ANSWER = {"role": "assistant", "content": "Fixed: greeting.txt now says hello.", "reasoning_content": "Checked."}


def test_the_agent_fixes_a_file_through_the_adapter_as_one_exact_sample(tiny_model, tools_dir, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "greeting.txt").write_text("hullo\n")
    steps = [bash_call("sed -i s/hullo/hello/ greeting.txt && cat greeting.txt"), ANSWER]
    with ScriptedUpstream(tiny_model, steps) as upstream:
        adapter = Adapter(AdapterConfig(tokenizer=tiny_model, upstreams=[upstream.url], max_context=131072))
        with AdapterServer(adapter) as server:
            key = adapter.sessions.open().key
            proc = run_builtin(tools_dir, work, server.url, key)
            result = adapter.sessions.finish(key).to_json()     # what finish_session replies
            sampled = [upstream.output_ids(s) for s in steps]
            second_prompt = upstream.tokenizer.decode(upstream.requests[1]["input_ids"])
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert (work / "greeting.txt").read_text() == "hello\n"
    summary = json.loads(proc.stdout.decode().splitlines()[-1])
    assert summary == {"final_text": ANSWER["content"], "turns": 2, "tool_calls": 1, "exit_reason": "stop"}
    assert "hello\n[exit code 0]" in second_prompt          # the command's output went back to the model
    assert len(result["samples"]) == 1, result["stats"]
    s = result["samples"][0]
    trained = [(t, lp) for t, m, lp in zip(s["tokens"][s["prompt_length"]:], s["loss_mask"],
                                           s["rollout_log_probs"], strict=True) if m]
    assert trained == [(t, logprob(i, t)) for ids in sampled for i, t in enumerate(ids)]
    assert result["stats"]["drift"]["fork"] == 0 and result["stats"]["drift"]["realign"] == 0
    t = BUILTIN.read_trajectory(proc.stdout, proc.stderr)
    assert (t.final_text, t.turns, t.tool_calls, t.exit_reason, t.raw_ok) == (ANSWER["content"], 2, 1, "stop", True)


def test_max_turns_and_a_cut_answer_end_with_their_own_exit_codes(tiny_model, tools_dir, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    long_answer = {"role": "assistant", "content": "word " * 200}
    with ScriptedUpstream(tiny_model, [bash_call("true"), long_answer]) as upstream:
        adapter = Adapter(AdapterConfig(tokenizer=tiny_model, upstreams=[upstream.url], max_context=131072))
        with AdapterServer(adapter) as server:
            capped = run_builtin(tools_dir, work, server.url, adapter.sessions.open().key,
                                 extra_args=("--max-turns", "1"))
            cut = run_builtin(tools_dir, work, server.url, adapter.sessions.open().key, max_new_tokens=16)
    assert capped.returncode == agent.EXIT_MAX_TURNS
    assert json.loads(capped.stdout.decode().splitlines()[-1])["exit_reason"] == "max_turns"
    assert cut.returncode == agent.EXIT_LENGTH
    assert BUILTIN.read_trajectory(cut.stdout, b"").exit_reason == "length"


class StatusServer:
    """Answers every POST with a fixed HTTP status, counting the requests."""

    def __init__(self, status: int):
        outer = self
        self.requests = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                outer.requests += 1
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = b'{"error": {"message": "no"}}'
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()


@pytest.mark.parametrize("status, code, reason, requests", [(400, agent.EXIT_REFUSED, "refused", 1),
                                                            (409, agent.EXIT_REFUSED, "refused", 1),
                                                            (503, agent.EXIT_UNREACHABLE, "unreachable", 1)])
def test_a_refusal_stops_at_once_and_a_dead_server_after_the_retry_budget(status, code, reason, requests, tools_dir,
                                                                         tmp_path):
    with StatusServer(status) as server:
        proc = run_builtin(tools_dir, tmp_path, server.url, "k", extra_args=("--retry-for", "0"))
    assert proc.returncode == code
    assert json.loads(proc.stdout.decode().splitlines()[-1])["exit_reason"] == reason
    assert server.requests == requests


def http_error(code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError("http://x", code, "status", {}, None)


def test_retries_back_off_through_restarts_and_overload(monkeypatch):
    failures = [http_error(529), http_error(503), http_error(429), ConnectionRefusedError(), ValueError("garbled")]
    answers = iter([*failures, {"choices": []}])

    def post(url, body, key, timeout_s):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(agent, "post_json", post)
    slept = []
    reply = agent.complete("u", {}, "k", retry_for_s=1000, timeout_s=1, sleep=slept.append, clock=lambda: 0.0)
    assert reply == {"choices": []} and slept == [1, 2, 4, 8, 16]


def test_retrying_gives_up_at_the_deadline_and_never_retries_a_4xx(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(agent, "post_json", lambda *a: (_ for _ in ()).throw(http_error(503)))
    with pytest.raises(agent.Unreachable, match="HTTP 503"):
        agent.complete("u", {}, "k", retry_for_s=10, timeout_s=1, clock=lambda: now[0],
                       sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert now[0] == 7.0   # slept 1 + 2 + 4; the next 8 would pass the 10 s deadline
    monkeypatch.setattr(agent, "post_json", lambda *a: (_ for _ in ()).throw(http_error(401)))
    with pytest.raises(agent.Refused, match="HTTP 401"):
        agent.complete("u", {}, "k", retry_for_s=1000, timeout_s=1, sleep=pytest.fail, clock=lambda: 0.0)


def test_the_shell_reports_exit_codes_and_leaves_nothing_running(tmp_path):
    shell = agent.Shell(str(tmp_path), timeout_s=30)
    assert shell.run("echo out; echo err >&2; exit 3") == "out\nerr\n[exit code 3]"
    assert shell.run("printf no-newline") == "no-newline\n[exit code 0]"
    t0 = time.monotonic()
    assert shell.run(f"sleep 30 & echo $! > {tmp_path}/pid") == "[exit code 0]"   # no wait for the job
    # a timeout long enough for a loaded machine to echo first; either sleep waited for takes 30 s
    timed_out = agent.Shell(str(tmp_path), timeout_s=2).run("echo started; sleep 30")
    assert time.monotonic() - t0 < 20 and timed_out.startswith("started\n[timed out after 2 s")
    pid = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert shell.run("pwd") == f"{tmp_path}\n[exit code 0]"


def test_long_output_keeps_its_head_and_tail(tmp_path):
    out = agent.Shell(str(tmp_path), timeout_s=30).run("seq 1 2000000")
    assert len(out) < agent.MAX_TOOL_OUTPUT + 200
    assert out.startswith("1\n2\n3\n") and out.endswith("1999999\n2000000\n[exit code 0]") and "cut" in out


@pytest.mark.parametrize("function, error", [({"name": "python", "arguments": "{}"}, "unknown tool 'python'"),
                                             ({"name": "bash", "arguments": "{not json"}, "bash takes JSON"),
                                             ({"name": "bash", "arguments": '{"cmd": "ls"}'}, "bash takes JSON")])
def test_a_malformed_tool_call_is_answered_not_fatal(function, error, tmp_path):
    assert error in agent.tool_result({"id": "c", "function": function}, agent.Shell(str(tmp_path), 5))


@pytest.mark.parametrize("stdout", [b"", b"not json\n", b'{"final_text": "x"}\n', b"[1, 2]\n",
                                    b'{"final_text": 1, "turns": 1, "tool_calls": 0, "exit_reason": "stop"}\n',
                                    b'{"final_text": "x", "turns": true, "tool_calls": 0, "exit_reason": "stop"}\n',
                                    b'\xff\xfe{"final_text"'])
def test_an_unreadable_summary_is_not_ok(stdout):
    assert not BUILTIN.read_trajectory(stdout, b"").raw_ok


def test_the_summary_is_read_from_the_last_line():
    line = b'{"final_text": null, "turns": 3, "tool_calls": 4, "exit_reason": "length"}'
    t = BUILTIN.read_trajectory(b"builtin_agent: noise\n" + line + b"\n", b"")
    assert (t.final_text, t.turns, t.tool_calls, t.exit_reason, t.raw_ok) == (None, 3, 4, "length", True)


def test_the_agent_is_stdlib_only_python_3_9():
    tree = ast.parse(Path(agent.__file__).read_text(), feature_version=(3, 9))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported and imported <= sys.stdlib_module_names | {"__future__"}, imported - sys.stdlib_module_names
    # Annotations stay unevaluated (no `X | None` at run time on 3.9): the future import is the first statement.
    assert isinstance(tree.body[1], ast.ImportFrom) and tree.body[1].module == "__future__"
