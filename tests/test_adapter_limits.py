"""The adapter stays responsive and refuses malformed requests with a 4xx in the API's JSON error shape.

A sandboxed agent can send anything: huge bodies, deep nesting, lone surrogates, NaN, absurd sampling
values, wrong types on the control routes, routes that do not exist. Each gets a 4xx JSON error in its
route's shape (Anthropic for /v1/messages..., OpenAI for the rest) and the adapter goes on serving. A
large request is parsed, rendered and tokenized off the event loop, so another session's turn is not held
up, and the memory it took is handed back. The adapter under test is real (`agentrl adapter serve` in
its own process for the timing and memory figures); only the model's token choices are scripted.
"""

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from scripted_upstream import ScriptedUpstream
from test_adapter_app import CTL, STEPS, make, open_session

pytestmark = pytest.mark.integration

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}
MSG = {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
CHAT = {"messages": [{"role": "user", "content": "x"}]}


def raw(body: dict, **replace: str) -> bytes:
    """The body as JSON text, with {"k": "@name"} placeholders swapped for raw JSON text (NaN, surrogates)."""
    text = json.dumps(body)
    for name, literal in replace.items():
        text = text.replace(f'"@{name}"', literal)
    return text.encode()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


ANTHROPIC, OPENAI = "anthropic", "openai"
CASES = [
    # (route, headers, body, status, needle)
    ("/v1/messages", "KEY", raw({**MSG, "metadata": "@x"}, x=nested(65)), 400, "more than 64 deep"),
    ("/v1/messages", "KEY", raw({**MSG, "metadata": "@x"}, x=nested(5000)), 400, "more than 64 deep"),
    ("/v1/chat/completions", "KEY", nested(30_000).encode(), 413, "the limit is 20,000 (max_json_items)"),
    ("/v1/messages", "KEY", {**MSG, "metadata": [0] * 25_000}, 413, "25,0"),
    ("/v1/messages", "KEY", raw({"max_tokens": 5, "messages": [{"role": "user", "content": "@x"}]}, x='"\\ud800"'),
     400, "lone UTF-16 surrogate"),
    ("/v1/chat/completions", "KEY", raw({"messages": [{"role": "user", "content": "@x"}]}, x='"a\\udc00b"'), 400,
     "surrogate"),
    ("/v1/messages", "KEY", raw(MSG).replace(b'"x"', b'"\xed\xa0\x80"'), 400, "surrogate"),   # as UTF-8 bytes
    ("/v1/messages", "KEY", raw({**MSG, "temperature": "@x"}, x="NaN"), 400, "NaN and Infinity are not JSON"),
    ("/v1/chat/completions", "KEY", raw({**CHAT, "temperature": "@x"}, x="-Infinity"), 400, "NaN and Infinity"),
    ("/v1/chat/completions", "KEY", raw({**CHAT, "top_p": "@x"}, x="1e999"), 400, "infinity"),
    ("/v1/messages", "KEY", {**MSG, "temperature": -5}, 400, "temperature must be greater than or equal to 0"),
    ("/v1/chat/completions", "KEY", {**CHAT, "temperature": -5}, 400, "temperature must be greater than"),
    ("/v1/messages", "KEY", {**MSG, "temperature": 1e300}, 400, "temperature must be less than or equal to 10"),
    ("/v1/messages", "KEY", {**MSG, "top_p": 0}, 400, "top_p must be greater than 0"),
    ("/v1/messages", "KEY", {**MSG, "top_k": 0}, 400, "top_k must be -1 (all tokens) or at least 1"),
    ("/v1/messages", "KEY", {**MSG, "max_tokens": 10**12}, 400, "max_tokens must be less than or equal to"),
    ("/v1/messages", "KEY", {**MSG, "max_tokens": True}, 400, "max_tokens must be a valid integer"),
    ("/v1/chat/completions", "KEY", {**CHAT, "seed": 2**70}, 400, "seed must be a valid integer"),
    ("/v1/chat/completions", "KEY", {**CHAT, "top_k": -2}, 400, "top_k must be greater than or equal to -1"),
    ("/v1/chat/completions", "KEY", {**CHAT, "stop": ["x"] * 65}, 400, "stop: List should have at most 64"),
    ("/v1/messages", "KEY", {**MSG, "stream": "yes"}, 400, "stream must be true or false"),
    ("/v1/chat/completions", "KEY", {**CHAT, "stream": "yes"}, 400, "stream must be true or false"),
    ("/v1/chat/completions", "KEY", {**CHAT, "stream_options": "all"}, 400, "stream_options must be an object"),
    ("/v1/chat/completions", "KEY", {**CHAT, "model": {"a": 1}}, 400, "model must be a string"),
    ("/v1/messages", "KEY", b"", 400, "not valid JSON"),
    ("/v1/messages/count_tokens", "KEY", raw({"messages": [{"role": "user", "content": "@x"}]}, x='"\\ud800"'), 400,
     "surrogate"),
    ("/v1/messages", "KEY", {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}] * 11}, 413,
     "11 messages; the limit is 10 (max_messages)"),
    ("/v1/chat/completions", "KEY", {"messages": [{"role": "user", "content": "x" * 1001}]}, 413,
     "the limit is 1,000 (max_request_chars)"),
    ("/v1/messages", "KEY", {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                             "tools": [{"name": "t", "input_schema": {"description": "y" * 1000}}]}, 413,
     "max_request_chars"),
    ("/v1/messages", "KEY", {"max_tokens": 5, "messages": [{"role": "user", "content": "x" * 70_000}]}, 413,
     "the limit is 65,536 (max_body_bytes)"),
    ("/v1/messages", "KEY", "STREAMED", 413, "while it was sent"),
    ("/_agentrl/open_session", CTL, {"key": 5}, 400, "key: Input should be a valid string"),
    ("/_agentrl/open_session", CTL, {"key": ""}, 400, "key: must be 1 to 256 printable ASCII characters"),
    ("/_agentrl/open_session", CTL, {"key": "a b\n"}, 400, "key: must be 1 to 256 printable ASCII characters"),
    ("/_agentrl/open_session", CTL, {"key": "k" * 257}, 400, "key: must be 1 to 256"),
    ("/_agentrl/open_session", CTL, {"sampling": {"temperature": "hot"}}, 400,
     "sampling.temperature must be a valid number"),
    ("/_agentrl/open_session", CTL, {"sampling": {"temperature": -1, "top_p": 2}}, 400,
     "sampling.temperature must be greater than or equal to 0; sampling.top_p must be less than or equal to 1"),
    ("/_agentrl/open_session", CTL, raw({"sampling": {"temperature": "@x"}}, x="NaN"), 400, "NaN"),
    ("/_agentrl/open_session", CTL, {"sampling": 5}, 400, "sampling: Input should be a valid dictionary"),
    ("/_agentrl/open_session", CTL, {"metadata": [1]}, 400, "metadata: Input should be a valid dictionary"),
    ("/_agentrl/open_session", CTL, {"sesion": {}}, 400, "sesion: unknown key"),
    ("/_agentrl/open_session", CTL, [1], 400, "the body must be a JSON object"),
    ("/_agentrl/finish_session", CTL, {"key": 5}, 400, "key: Input should be a valid string"),
    ("/_agentrl/finish_session", CTL, {}, 400, "key: Field required"),
    ("/_agentrl/drop_session", CTL, raw({"key": "@x"}, x='"\\udfff"'), 400, "surrogate"),
    ("/_agentrl/drop_session", CTL, raw({"key": "k", "m": "@x"}, x=nested(65)), 400, "more than 64 deep"),
    ("/_agentrl/open_session", CTL, {"metadata": {"m": "x" * (1 << 20)}}, 413, "control routes' limit"),
    ("/_agentrl/open_session", {}, {}, 403, "control routes need"),
]


def shape_of(path: str) -> str:
    return ANTHROPIC if path == "/v1/messages" or path.startswith("/v1/messages/") else OPENAI


def assert_error_shape(response: httpx.Response, shape: str) -> str:
    """The error's message, after checking the response is a 4xx JSON error in `shape`, and nothing more."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/json", response.text
    body = response.json()
    if shape == ANTHROPIC:
        assert set(body) == {"type", "error"} and body["type"] == "error", body
        assert set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["param"] is None or isinstance(body["error"]["param"], str)
        assert body["error"]["code"] is None
    assert isinstance(body["error"]["type"], str) and isinstance(body["error"]["message"], str)
    return body["error"]["message"]


@pytest.mark.parametrize("path,headers,body,status,needle", CASES)
def test_malformed_requests_get_a_4xx_in_their_apis_shape_and_a_real_session_goes_on(tiny_model, path, headers,
                                                                                     body, status, needle):
    async def streamed():
        for _ in range(70):
            yield b" " * 1000     # no Content-Length: counted as it arrives

    async def go():
        _, script, c = make(tiny_model, [STEPS[2]], max_body_bytes=64 << 10, max_json_items=20_000,
                            max_messages=10, max_request_chars=1000)
        key = await open_session(c, sampling={"temperature": 0.5})
        h = {"x-api-key": key} if headers == "KEY" else headers
        if body == "STREAMED":
            bad = await c.post(path, headers=h, content=streamed())
        elif isinstance(body, bytes):
            bad = await c.post(path, headers={**h, "content-type": "application/json"}, content=body)
        else:
            bad = await c.post(path, headers=h, json=body)
        good = await c.post("/v1/messages", headers={"x-api-key": key}, json=SMALL)
        return bad, good, script.requests
    bad, good, upstream_calls = asyncio.run(go())
    assert bad.status_code == status, bad.text
    assert needle in assert_error_shape(bad, shape_of(path))
    assert good.status_code == 200, good.text
    assert len(upstream_calls) == 1 and upstream_calls[0]["sampling_params"]["temperature"] == 0.5


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/nope", 404), ("POST", "/v1/complete", 404), ("POST", "/v1/messages/batches", 404),
    ("GET", "/v1/messages", 405), ("DELETE", "/v1/chat/completions", 405), ("PUT", "/_agentrl/open_session", 405),
    ("POST", "/v1/models", 405), ("GET", "/_agentrl/finish_session", 405),
    ("GET", "/v1/responses", 405), ("DELETE", "/v1/responses", 405), ("POST", "/v1/nope", 404),
    ("GET", "/v1/responses/resp_1", 404), ("POST", "/v1/responses/resp_1/cancel", 404),
    ("POST", "/v1/responses/input_tokens", 404), ("POST", "/v1/responses/", 404), ("POST", "/v1/messages/", 404),
    ("POST", "/v1/messagesx", 404), ("OPTIONS", "/v1/messages", 405), ("PATCH", "/v1/messages/count_tokens", 405),
])
def test_unknown_routes_and_methods_answer_in_the_apis_shape(tiny_model, method, path, status):
    async def go():
        _, _, c = make(tiny_model, [])
        return await c.request(method, path, headers={"x-api-key": "k"})
    r = asyncio.run(go())
    assert r.status_code == status
    message = assert_error_shape(r, shape_of(path))
    assert path in message and method in message
    if status == 405:
        assert "allow" in r.headers and r.headers["allow"] in message


def test_sampling_values_that_pass_are_forwarded_as_given(tiny_model):
    async def go():
        _, script, c = make(tiny_model, [STEPS[2]] * 2)
        key = await open_session(c, sampling={"temperature": 0, "top_k": -1, "stop": "END"})
        await c.post("/v1/chat/completions", headers={"x-api-key": key},
                     json={**CHAT, "top_p": 1, "seed": -3, "stop": "x", "stream": False})
        return [r["sampling_params"] for r in script.requests]
    [params] = asyncio.run(go())
    assert params["temperature"] == 0.0 and params["top_k"] == -1 and params["stop"] == ["END"]
    assert params["top_p"] == 1.0 and params["sampling_seed"] == -3


def test_turns_of_one_session_at_once_each_render_alone_and_all_are_recorded(tiny_model):
    """Sub-agents share their CLI's key: concurrent turns of a session take its lock in turn."""
    async def go():
        adapter, _, c = make(tiny_model, [STEPS[2]] * 4)
        key = await open_session(c)
        bodies = [{**SMALL, "messages": [{"role": "user", "content": f"task {i} " * 2000}]} for i in range(4)]
        replies = await asyncio.gather(*(c.post("/v1/messages", json=b, headers={"x-api-key": key}) for b in bodies))
        return replies, (await c.post("/_agentrl/finish_session", json={"key": key}, headers=CTL)).json()
    replies, result = asyncio.run(go())
    assert [r.status_code for r in replies] == [200] * 4
    assert result["stats"]["turns"] == 4 and len(result["samples"]) == 4


def test_the_gc_comes_back_on_after_any_parse():
    import gc

    from agentrl.adapter.limits import RequestError, gc_paused, parse_json
    assert gc.isenabled()
    for body in (b"[1]", b"[NaN]", nested(100).encode(), b"[" + b"0," * 100 + b"0]"):
        try:
            parse_json(body, max_depth=64, max_items=50)
        except RequestError:
            pass
        assert gc.isenabled()
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


# ------------------------------------------------------------ responsiveness and memory, over real sockets


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def big_conversation(chars: int, messages: int) -> dict:
    line = "def f(x):\n    return [x * 2 for x in range(10)]  # a line of code\n"
    per = chars // messages
    text = (line * (per // len(line) + 1))[:per]
    return {"model": "m", "max_tokens": 64, "messages": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": text} for i in range(messages)]}


def test_a_large_request_does_not_hold_up_other_sessions_and_its_memory_comes_back(tiny_model, tmp_path):
    """With the default limits: the largest conversation allowed, bodies of the most bytes allowed shaped to
    be slow to parse, and 50 MB bodies (refused: by Content-Length, and while streaming without one)."""
    from agentrl.adapter.service import AdapterConfig

    defaults = AdapterConfig.model_fields
    max_bytes, max_chars = defaults["max_body_bytes"].default, defaults["max_request_chars"].default
    max_items = defaults["max_json_items"].default
    allowed = json.dumps(big_conversation(max_chars - 60_000, 2000)).encode()   # keys count too
    lists = "[" + ",".join(["[0]"] * (max_items // 2 - 10)) + "]"     # the most values allowed, and then bytes
    densest = raw({**SMALL, "metadata": {"a": "@x", "pad": "x" * (max_bytes - len(lists) - 200)}}, x=lists)
    assert max_bytes - 4096 < len(densest) <= max_bytes
    dense = raw({**SMALL, "metadata": "@x"}, x="[" + ",".join(["[0]"] * ((max_bytes - 200) // 4)) + "]")
    huge = b" " * (50 << 20)
    bigs = [("allowed conversation", allowed, {}, 200), ("densest allowed", densest, {}, 200),
            ("16 MiB of arrays", dense, {}, 413), ("50 MB declared", huge, {}, 413),
            ("50 MB streamed", huge, {"stream": True}, 413)]
    token_file = tmp_path / "control"
    with ScriptedUpstream(tiny_model, [{"role": "assistant", "content": "ok"}] * 2000) as upstream:
        proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "adapter", "serve", "--upstream", upstream.url,
                                 "--tokenizer", str(tiny_model), "--port", "0", "--control-token-file",
                                 str(token_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            line = proc.stdout.readline()
            assert line.startswith("agentrl adapter listening on http://"), proc.stderr.read()
            url = line.split()[4]
            ctl = {"x-agentrl-control": token_file.read_text().strip()}
            with httpx.Client(base_url=url, timeout=120) as c:
                small_key = c.post("/_agentrl/open_session", json={}, headers=ctl).json()["key"]
                big_key = c.post("/_agentrl/open_session", json={}, headers=ctl).json()["key"]
                for _ in range(5):   # warm up: imports, the tokenizer, the allocator's first arenas
                    assert c.post("/v1/messages", json=SMALL, headers={"x-api-key": small_key}).status_code == 200
                # the slowest of 20 small turns alone, on this machine as loaded as it is now: the bound below
                # scales with it
                alone = []
                for _ in range(20):
                    t0 = time.perf_counter()
                    assert c.post("/v1/messages", json=SMALL, headers={"x-api-key": small_key}).status_code == 200
                    alone.append(time.perf_counter() - t0)
                baseline, _ = rss_mib(proc.pid)
                figures = {}
                for name, body, how, status in bigs:
                    figures[name] = during(url, small_key, big_key, body, how, status)
                deadline = time.monotonic() + 5   # memory is handed back just after each answer, in a thread
                while (after := rss_mib(proc.pid)[0]) - baseline >= 256 and time.monotonic() < deadline:
                    time.sleep(0.1)
                peak = rss_mib(proc.pid)[1]
        finally:
            proc.terminate()
            proc.wait(10)
    print(f"\nRSS baseline {baseline:.0f} MiB, after {after:.0f} MiB, peak {peak:.0f} MiB")
    for name, (took, n, worst) in figures.items():
        print(f"{name}: answered in {took:.2f} s; {n} small turns meanwhile, the slowest {worst * 1000:.0f} ms")
    # a large body parsed on the event loop would hold every other turn for seconds; beside it a small turn
    # may wait a little (1 s on a quiet machine), scaled by how slow one is alone here now
    bound = max(1.0, 20 * max(alone))
    print(f"a small turn alone: slowest {max(alone) * 1000:.0f} ms of 20; bound beside a large one {bound:.2f} s")
    for (name, _, _, status), (_, n, worst) in zip(bigs, figures.values(), strict=True):
        assert worst < bound, f"{name}: a small turn of another session took {worst:.2f} s"
        assert n >= 1 or status != 200, f"{name}: no small turn overlapped it"
    assert after - baseline < 256, f"RSS went from {baseline:.0f} MiB to {after:.0f} MiB and stayed there"
    assert peak - baseline < 2048


def during(url: str, small_key: str, big_key: str, body: bytes, how: dict, status: int) -> tuple[float, int, float]:
    """Send `body` while another session's small turns run back to back: (its seconds, turns, slowest turn)."""
    done, result = threading.Event(), {}

    def send_big():
        headers = {"x-api-key": big_key, "content-type": "application/json"}
        content = (body[i:i + (1 << 20)] for i in range(0, len(body), 1 << 20)) if how.get("stream") else body
        t0 = time.perf_counter()
        try:
            with httpx.Client(base_url=url, timeout=300) as c:
                r = c.post("/v1/messages", content=content, headers=headers)
            result["status"], result["text"] = r.status_code, r.text[:300]
        finally:
            result["took"] = time.perf_counter() - t0
            done.set()

    sender = threading.Thread(target=send_big)
    latencies = []
    with httpx.Client(base_url=url, timeout=60) as c:
        sender.start()
        while not done.is_set():    # every turn that starts before the large request is answered
            t0 = time.perf_counter()
            r = c.post("/v1/messages", json=SMALL, headers={"x-api-key": small_key})
            latencies.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
    sender.join()
    assert result["status"] == status, result
    return result["took"], len(latencies), max(latencies, default=0.0)
