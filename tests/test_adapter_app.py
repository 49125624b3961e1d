"""The adapter's HTTP service with the real tiny tokenizer; the model's token choices come from a script.

The upstream here is httpx's MockTransport (in-process): what is under test is everything between
the wire and /generate. tests/test_adapter_clis.py drives real CLIs over real sockets.
"""

import asyncio
import json

import httpx
import pytest

from agentrl.adapter.app import CONTROL_HEADER, create_app
from agentrl.adapter.service import Adapter, AdapterConfig, load_tokenizer
from agentrl.adapter.upstream import UpstreamPool
from agentrl.models.tiny import assistant_text

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

CTL = {CONTROL_HEADER: "control-token"}
BASH = {"name": "Bash", "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"},
                                                          "timeout": {"type": "integer"}}}}
OPENAI_BASH = {"type": "function", "function": {"name": "Bash", "description": "Run a shell command",
                                                "parameters": BASH["input_schema"]}}


def logprob(pos: int, token: int) -> float:
    return -((token * 31 + pos) % 97 + 1) / 100.0


class Script:
    """Scripted /generate: each call answers the next assistant message as the tiny model's token ids."""

    def __init__(self, tokenizer, steps):
        self.tok, self.steps, self.requests, self.sampled = tokenizer, list(steps), [], []
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.abort_next = False      # answer the next call as SGLang does when a pause aborts it

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        step = self.steps.pop(0)
        if isinstance(step, int):
            return httpx.Response(step, text="scripted failure")
        if isinstance(step, float):
            await asyncio.sleep(step)
            step = {"role": "assistant", "content": "late"}
        ids = self.tok.encode(assistant_text(step), add_special_tokens=False) + [self.end]
        limit = body["sampling_params"]["max_new_tokens"]
        finish = {"type": "stop", "matched": self.end} if len(ids) <= limit else {"type": "length", "length": limit}
        ids = ids[:limit]
        if self.abort_next:
            self.abort_next = False
            finish, ids = {"type": "abort", "message": "Aborted"}, ids[:3]
        else:
            self.sampled.append(ids)
        return httpx.Response(200, json={"text": "", "output_ids": ids, "meta_info": {
            "finish_reason": finish, "weight_version": "7",
            "output_token_logprobs": [[logprob(i, t), t, None] for i, t in enumerate(ids)]}})


def make(tiny_model, steps, upstreams=("http://up",), live=None, **config):
    cfg = AdapterConfig(tokenizer=tiny_model, upstreams=list(upstreams), **config)
    tokenizer = load_tokenizer(tiny_model)
    script = Script(tokenizer, steps)
    adapter = Adapter(cfg, tokenizer, UpstreamPool(live or cfg.upstreams, transport=httpx.MockTransport(script)))
    app = create_app(adapter, CTL[CONTROL_HEADER])
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://adapter")
    return adapter, script, client


async def open_session(client, **body) -> str:
    r = await client.post("/_agentrl/open_session", json=body, headers=CTL)
    assert r.status_code == 200, r.text
    return r.json()["key"]


async def finish(client, key) -> dict:
    r = await client.post("/_agentrl/finish_session", json={"key": key}, headers=CTL)
    assert r.status_code == 200, r.text
    return r.json()


def call(name_args_list):
    return [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(name_args_list)]


STEPS = [
    {"role": "assistant", "content": "Let me look.", "reasoning_content": "Start by listing.",
     "tool_calls": call([("Bash", {"command": "ls -la\ncat README"})])},
    {"role": "assistant", "content": "", "reasoning_content": "Run the tests.",
     "tool_calls": call([("Bash", {"command": "pytest -q", "timeout": 60}), ("Bash", {"command": "git diff"})])},
    {"role": "assistant", "content": "Fixed: the off-by-one in `paginate`.", "reasoning_content": "Done."},
]


def assert_one_exact_sample(result, script):
    samples = result["samples"]
    assert len(samples) == 1 and result["stats"]["drift"]["clean"] == len(script.sampled) - 1
    # Each later turn rendered and tokenized only what was new.
    assert result["stats"]["incremental_renders"] == result["stats"]["prefix_hits"] == len(script.sampled) - 1
    s = samples[0]
    response = s["tokens"][s["prompt_length"]:]
    trained = [(t, lp) for t, m, lp in zip(response, s["loss_mask"], s["rollout_log_probs"], strict=True) if m]
    sampled = [(t, logprob(i, t)) for ids in script.sampled for i, t in enumerate(ids)]
    assert s["trained_tokens"] == sum(map(len, script.sampled)) == len(trained)
    assert trained == sampled


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_tool_session_is_one_exact_sample(tiny_model, stream):
    async def go():
        adapter, script, c = make(tiny_model, STEPS)
        key = await open_session(c)
        body = {"model": "claude-x", "max_tokens": 4096, "stream": stream, "tools": [BASH],
                "system": [{"type": "text", "text": "You are a coding agent."}],
                "messages": [{"role": "user", "content": "Fix the bug."}], "metadata": {"user_id": "u"},
                "thinking": {"type": "enabled", "budget_tokens": 100}}
        for _ in range(3):
            r = await c.post("/v1/messages?beta=true", json=body, headers={"x-api-key": key})
            assert r.status_code == 200, r.text
            content = sse_message(r.text) if stream else r.json()["content"]
            body["messages"].append({"role": "assistant", "content": content})
            uses = [b for b in content if b["type"] == "tool_use"]
            if uses:
                body["messages"].append({"role": "user", "content": [
                    *({"type": "tool_result", "tool_use_id": u["id"], "content": [{"type": "text", "text": "ok"}]}
                      for u in uses), {"type": "text", "text": "<system-reminder>keep going</system-reminder>"}]})
        assert [b["type"] for b in body["messages"][1]["content"]] == ["thinking", "text", "tool_use"]
        assert body["messages"][1]["content"][2]["input"] == {"command": "ls -la\ncat README"}
        assert body["messages"][3]["content"][2]["input"] == {"command": "git diff"}
        assert body["messages"][3]["content"][1]["input"] == {"command": "pytest -q", "timeout": 60}
        return await finish(c, key), script
    result, script = asyncio.run(go())
    assert_one_exact_sample(result, script)


def sse_message(text: str) -> list[dict]:
    """Rebuild the content blocks from an Anthropic SSE stream, as a client does."""
    blocks, events = [], [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    for e in events:
        if e["type"] == "content_block_start":
            blocks.append(dict(e["content_block"], _json=""))
        elif e["type"] == "content_block_delta":
            d, b = e["delta"], blocks[e["index"]]
            key = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature",
                   "input_json_delta": "_json"}[d["type"]]
            b[key] = b.get(key, "") + d[{"input_json_delta": "partial_json"}.get(d["type"], key)]
    for b in blocks:
        raw = b.pop("_json")
        if b["type"] == "tool_use":
            b["input"] = json.loads(raw)
    return blocks


def js_echo(msg: dict) -> dict:
    """What Qwen Code sends back: reasoning trimmed, arguments re-serialized by JSON.stringify."""
    def js(value):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return {k: js(v) for k, v in value.items()} if isinstance(value, dict) else value
    msg = dict(msg, reasoning_content=msg["reasoning_content"].strip())
    msg["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.dumps(
        js(json.loads(c["function"]["arguments"])), separators=(",", ":")))) for c in msg.get("tool_calls") or []]
    return msg


QWEN_STEPS = [dict(STEPS[0], reasoning_content="  Start by listing.  "),
              dict(STEPS[1], tool_calls=call([("Bash", {"command": "pytest -q", "timeout": 60.0})])), STEPS[2]]


@pytest.mark.parametrize("echo_key", ["reasoning_content", "reasoning", "js", None])
def test_openai_session_and_the_reasoning_echo(tiny_model, echo_key):
    async def go():
        adapter, script, c = make(tiny_model, QWEN_STEPS if echo_key == "js" else STEPS)
        key = await open_session(c)
        body = {"model": "qwen", "tools": [OPENAI_BASH], "messages": [
            {"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the bug."}]}
        for _ in range(3):
            r = await c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
            msg = r.json()["choices"][0]["message"]
            if echo_key == "js":
                msg = js_echo(msg)
            reasoning = msg.pop("reasoning_content", None)
            if echo_key and reasoning:
                msg["reasoning_content" if echo_key == "js" else echo_key] = reasoning
            body["messages"].append(msg)
            for tc in msg.get("tool_calls") or []:
                body["messages"].append({"role": "tool", "tool_call_id": tc["id"], "content": "ok"})
        return await finish(c, key), script
    result, script = asyncio.run(go())
    if echo_key:
        assert_one_exact_sample(result, script)
        # the trimmed reasoning and the re-serialized 60.0 were put back as they were sampled
        assert result["stats"]["echoes_restored"] == (2 if echo_key == "js" else 0)
    else:
        # A client that drops reasoning changes the re-render: the turns no longer chain cleanly,
        # which is why both keys are read.
        assert result["stats"]["drift"]["clean"] < 2


def test_openai_streaming_carries_reasoning_tool_calls_and_usage(tiny_model):
    async def go():
        _, _, c = make(tiny_model, STEPS[:1])
        key = await open_session(c)
        r = await c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={
            "model": "q", "stream": True, "stream_options": {"include_usage": True}, "tools": [OPENAI_BASH],
            "messages": [{"role": "user", "content": "hi"}]})
        return r.text
    text = asyncio.run(go())
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert text.rstrip().endswith("data: [DONE]")
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Start by listing."
    assert "".join(d.get("content") or "" for d in deltas) == "Let me look."
    args = "".join(tc["function"].get("arguments", "") for d in deltas for tc in d.get("tool_calls", []))
    assert json.loads(args) == {"command": "ls -la\ncat README"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] > 0


def test_session_sampling_outranks_the_body_which_fills_the_rest(tiny_model):
    async def go():
        _, script, c = make(tiny_model, [{"role": "assistant", "content": "a"}] * 2, max_new_tokens=500)
        key = await open_session(c, sampling={"temperature": 0.2, "max_new_tokens": 300})
        body = {"model": "m", "max_tokens": 4096, "temperature": 1.0, "top_p": 0.9, "top_k": 20,
                "messages": [{"role": "user", "content": "x"}]}
        await c.post("/v1/messages", json=body, headers={"x-api-key": key})
        other = await open_session(c)
        await c.post("/v1/messages", json=body, headers={"x-api-key": other})
        return [r["sampling_params"] for r in script.requests]
    pinned, free = asyncio.run(go())
    assert (pinned["temperature"], pinned["top_p"], pinned["top_k"], pinned["max_new_tokens"]) == (0.2, 0.9, 20, 300)
    assert (free["temperature"], free["max_new_tokens"]) == (1.0, 500)   # the config's cap is under the body's
    assert pinned["stop_token_ids"] and free["stop_token_ids"] == pinned["stop_token_ids"]


def test_context_budget_clamps_output_and_a_full_prompt_stops_without_calling_upstream(tiny_model):
    async def go():
        _, script, c = make(tiny_model, [{"role": "assistant", "content": "word " * 600}], max_context=300)
        key = await open_session(c)
        body = {"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "short"}]}
        r1 = (await c.post("/v1/messages", json=body, headers={"x-api-key": key})).json()
        body["messages"][0]["content"] = "long " * 400
        r2 = (await c.post("/v1/messages", json=body, headers={"x-api-key": key})).json()
        r3 = (await c.post("/v1/chat/completions", json=body, headers={"x-api-key": key})).json()
        return script, r1, r2, r3, await finish(c, key)
    script, r1, r2, r3, result = asyncio.run(go())
    assert len(script.requests) == 1
    room = script.requests[0]["sampling_params"]["max_new_tokens"]
    assert room == 300 - r1["usage"]["input_tokens"] and r1["stop_reason"] == "max_tokens"
    assert r2["stop_reason"] == "max_tokens" and r2["usage"]["output_tokens"] == 0
    assert r3["choices"][0]["finish_reason"] == "length"
    assert result["stats"]["context_full"] == 2 and result["stats"]["turns"] == 1
    assert result["samples"][0]["truncated"]


def test_a_failed_upstream_is_retryable_and_not_recorded(tiny_model):
    async def go():
        adapter, script, c = make(tiny_model, [503, STEPS[2]], upstreams=("http://a", "http://b"))
        key = await open_session(c)
        body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]}
        r1 = await c.post("/v1/messages", json=body, headers={"x-api-key": key})
        r2 = await c.post("/v1/messages", json=body, headers={"x-api-key": key})
        return r1, r2, await finish(c, key)
    r1, r2, result = asyncio.run(go())
    assert r1.status_code == 529 and r1.json()["error"]["type"] == "overloaded_error"
    assert r2.status_code == 200
    assert result["stats"]["turns"] == 1 and result["stats"]["upstream_errors"] == 1


@pytest.mark.parametrize("path,body", [
    ("/v1/messages", {"max_tokens": 100, "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ("/v1/responses", {"input": "x"}),
])
def test_a_failed_upstream_after_a_stream_started_is_an_error_event_in_the_apis_shape(tiny_model, path, body):
    """A streamed turn's response starts before the model answers (tests/test_adapter_keepalive.py): its
    status code is gone by then, so the failure is the stream's last event, and the client may retry."""
    async def go():
        _, script, c = make(tiny_model, [503, STEPS[2]])
        key = await open_session(c)
        failed = await c.post(path, json={**body, "model": "m", "stream": True}, headers={"x-api-key": key})
        retried = await c.post(path, json={**body, "model": "m", "stream": True}, headers={"x-api-key": key})
        return failed, retried, await finish(c, key)
    failed, retried, result = asyncio.run(go())
    assert failed.status_code == retried.status_code == 200
    events = [json.loads(line[6:]) for line in failed.text.splitlines() if line.startswith("data: {")]
    opening, last = events[0], events[-1]
    if path == "/v1/messages":
        assert opening["type"] == "message_start" and opening["message"]["usage"]["input_tokens"] > 0
        assert "event: error" in failed.text and last == {"type": "error", "error": {
            "type": "overloaded_error", "message": last["error"]["message"]}}
    elif path == "/v1/chat/completions":
        assert opening["choices"][0]["delta"]["role"] == "assistant" and "[DONE]" not in failed.text
        assert set(last) == {"error"} and last["error"]["type"] == "server_error"
    else:
        assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]
        assert last["response"]["error"]["code"] == "server_error" and last["sequence_number"] == 2
    assert "the model server failed; retry" in failed.text
    assert result["stats"]["turns"] == 1 and result["stats"]["upstream_errors"] == 1


def test_sessions_stick_to_a_server_and_skip_stale_ones(tiny_model):
    async def go():
        adapter, script, c = make(tiny_model, [STEPS[2]] * 6, live=lambda: ["http://a", "http://c"])
        keys = [await open_session(c) for _ in range(3)]
        body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]}
        for key in keys + keys:
            await c.post("/v1/messages", json=body, headers={"x-api-key": key})
        return [adapter.sessions.get(k).upstream for k in keys]
    servers = asyncio.run(go())
    assert "http://b" not in servers and set(servers) == {"http://a", "http://c"}


@pytest.mark.parametrize("path,headers,body,status,needle", [
    ("/v1/messages", {}, {"max_tokens": 5, "messages": []}, 401, "no API key"),
    ("/v1/messages", {"x-api-key": "guess"}, {"max_tokens": 5, "messages": []}, 401, "unknown API key"),
    ("/v1/messages", "KEY", b"{not json", 400, "not valid JSON"),
    ("/v1/messages", "KEY", [1, 2], 400, "must be a JSON object"),
    ("/v1/messages", "KEY", {"messages": []}, 400, "max_tokens is required"),
    ("/v1/messages", "KEY", {"max_tokens": "5", "messages": []}, 400, "max_tokens is required"),
    ("/v1/messages", "KEY", {"max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, 400, "robot"),
    ("/v1/messages", "KEY", {"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}]}, 400, "unknown tool_use_id"),
    ("/v1/messages", "KEY", {"max_tokens": 5, "temperature": "hot", "messages": []}, 400, "temperature must be"),
    ("/v1/chat/completions", "KEY", {"messages": [{"role": "tool", "tool_call_id": "x", "content": "r"}]}, 400,
     "unknown tool_call_id"),
    ("/v1/chat/completions", "KEY", {"n": 3, "messages": []}, 400, "n must be 1"),
    ("/v1/chat/completions", "KEY", {"messages": [{"role": "assistant", "tool_calls": [
        {"id": "a", "function": {"name": "f", "arguments": "{oops"}}]}]}, 400, "not valid JSON"),
    ("/v1/chat/completions", "KEY", {"messages": "hello"}, 400, "messages must be a list"),
    ("/v1/messages", "KEY", {"max_tokens": 5, "messages": [{"role": "user", "content": "x" * 3000}]}, 413,
     "limit"),
    ("/_agentrl/open_session", {}, {}, 403, "control"),
    ("/_agentrl/finish_session", CTL, {"key": "nope"}, 404, "no open session"),
    ("/_agentrl/open_session", CTL, {"sampling": {"temprature": 1}}, 400, "unknown sampling keys"),
])
def test_bad_requests_get_a_clear_4xx_and_a_real_session_goes_on(tiny_model, path, headers, body, status, needle):
    async def go():
        _, script, c = make(tiny_model, [STEPS[2]], max_body_bytes=2048)
        key = await open_session(c)
        h = {"x-api-key": key} if headers == "KEY" else headers
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        bad = await c.post(path, headers=h, **kw)
        good = await c.post("/v1/messages", headers={"x-api-key": key},
                            json={"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]})
        return bad, good
    bad, good = asyncio.run(go())
    assert bad.status_code == status and needle in bad.text, bad.text
    assert bad.headers["content-type"] == "application/json"
    assert good.status_code == 200


def test_finished_sessions_answer_409_and_unknown_keys_can_open_when_allowed(tiny_model):
    async def go():
        _, _, c = make(tiny_model, [STEPS[2]] * 2, open_unknown_keys=True)
        body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]}
        first = await c.post("/v1/messages", json=body, headers={"x-api-key": "by-hand"})
        done = await finish(c, "by-hand")
        late = await c.post("/v1/messages", json=body, headers={"x-api-key": "by-hand"})
        reopen = await c.post("/_agentrl/open_session", json={"key": "by-hand"}, headers=CTL)
        return first, done, late, reopen
    first, done, late, reopen = asyncio.run(go())
    assert first.status_code == 200 and len(done["samples"]) == 1
    assert late.status_code == 409 and "finished" in late.json()["error"]["message"]
    assert reopen.status_code == 409


def test_an_ill_formed_tool_call_becomes_text_and_is_counted(tiny_model):
    bad = {"role": "assistant", "content": "<tool_call>\n<function=Nope>\n</function>\n</tool_call>"}

    async def go():
        _, _, c = make(tiny_model, [bad])
        key = await open_session(c)
        r = await c.post("/v1/messages", headers={"x-api-key": key}, json={
            "model": "m", "max_tokens": 100, "tools": [BASH], "messages": [{"role": "user", "content": "x"}]})
        return r.json(), await finish(c, key)
    reply, result = asyncio.run(go())
    assert reply["stop_reason"] == "end_turn" and reply["content"][0]["text"] == bad["content"]
    assert result["stats"]["ill_formed_turns"] == 1


def test_models_count_tokens_and_health(tiny_model):
    async def go():
        adapter, _, c = make(tiny_model, [])
        key = await open_session(c)
        body = {"model": "m", "messages": [{"role": "user", "content": "count me"}]}
        n = (await c.post("/v1/messages/count_tokens", json=body, headers={"x-api-key": key})).json()
        rendered = adapter.tokenizer.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
        return (n, len(adapter.tokenizer.encode(rendered, add_special_tokens=False)),
                (await c.get("/v1/models")).json(), (await c.get("/healthz")).json())
    n, expected, models, health = asyncio.run(go())
    assert n == {"input_tokens": expected}
    assert models["data"][0]["id"] == "agentrl" and health["ok"] and health["sessions"] == 1


def test_open_session_advertises_the_public_url(tiny_model):
    async def go():
        _, _, c = make(tiny_model, [], public_url="https://login1.cluster/proxy/adapter")
        return (await c.post("/_agentrl/open_session", json={"metadata": {"task": "t1"}}, headers=CTL)).json()
    opened = asyncio.run(go())
    assert opened["base_url"] == "https://login1.cluster/proxy/adapter" and opened["key"].startswith("sk-agentrl-")


def test_an_aborted_generation_is_retryable_and_not_recorded(tiny_model):
    async def go():
        adapter, script, c = make(tiny_model, [STEPS[2], STEPS[2]])
        script.abort_next = True
        key = await open_session(c)
        body = {"model": "m", "max_tokens": 100, "seed": 7, "messages": [{"role": "user", "content": "x"}]}
        first = await c.post("/v1/chat/completions", json=body, headers={"x-api-key": key})
        second = await c.post("/v1/chat/completions", json=body, headers={"x-api-key": key})
        return first, second, script.requests, await finish(c, key)
    first, second, requests, result = asyncio.run(go())
    assert first.status_code == 503 and "aborted" in first.json()["error"]["message"]
    assert second.status_code == 200 and result["stats"]["turns"] == 1 and result["stats"]["upstream_aborts"] == 1
    assert requests[0]["sampling_params"]["sampling_seed"] == 7      # SGLang's name for the seed


@pytest.mark.parametrize("value,ok", [(5.0, True), (0.2, True), (60, True), (0, False), (-1, False), (61, False),
                                      ("soon", False)])
def test_the_keepalive_interval_is_validated(tiny_model, value, ok):
    from pydantic import ValidationError

    from hpc.validation import problems
    try:
        cfg = AdapterConfig(tokenizer=tiny_model, upstreams=["http://up"], keepalive_s=value)
    except ValidationError as e:
        assert not ok and [field for field, _ in problems(e)] == ["keepalive_s"]
    else:
        assert ok and cfg.keepalive_s == float(value)
