"""Long turns: a streamed reply starts at once and sends its API's keepalive while the model works.

Real sockets: the adapter serves on TCP and the scripted model server sleeps before it answers. Times are
scaled down 500x: a client whose read timeout is 0.6 s (Codex's stream idle timeout is 300 s) waits on a
2 s turn (a 17-minute one). Streamed, the turn completes; not streamed, the client gives up, as it
would without keepalives (docs/adapter.md lists which clients give up after how long).
"""

import json
import time

import httpx
import pytest
from scripted_upstream import ScriptedUpstream
from test_adapter_responses import openai_sdk
from waiting import wait_until

from agentrl.adapter.serve import AdapterServer
from agentrl.adapter.service import Adapter, AdapterConfig

pytestmark = pytest.mark.integration

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

TURN_S, KEEPALIVE_S, READ_TIMEOUT_S = 2.0, 0.2, 0.6
DONE = {"role": "assistant", "content": "Done.", "reasoning_content": "It took a while."}
ASK = "Take your time."
APIS = {   # api: (route, non-streaming body, its keepalive line, the reply's first line, the stream's last line)
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": ASK}]},
                  "event: ping", "event: content_block_start", 'data: {"type": "message_stop"}'),
    "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": ASK}]},
             ": keepalive", 'data: {"id": "chatcmpl-', "data: [DONE]"),
    "responses": ("/v1/responses", {"model": "m", "input": ASK},
                  "event: keepalive", "event: response.output_item.added", 'data: {"type": "response.completed"'),
}


def serve(tiny_model, steps, **config):
    upstream = ScriptedUpstream(tiny_model, steps).__enter__()
    adapter = Adapter(AdapterConfig(tokenizer=tiny_model, upstreams=[upstream.url], keepalive_s=KEEPALIVE_S, **config))
    return upstream, adapter, AdapterServer(adapter).start()


def read_stream(url: str, body: dict, key: str, timeout: httpx.Timeout,
                upstream: ScriptedUpstream | None = None) -> tuple[int, list[tuple[int, str]]]:
    """(status, [(how many model calls had answered when the line came, line)]) of a streamed reply; blank
    lines left out. Events in order, not seconds: a loaded machine stretches every interval."""
    lines = []
    with httpx.stream("POST", url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=timeout) as r:
        for line in r.iter_lines():
            if line:
                lines.append((len(upstream.answered) if upstream else 0, line))
        return r.status_code, lines


@pytest.mark.parametrize("api", sorted(APIS))
def test_a_streamed_turn_longer_than_the_read_timeout_completes_with_keepalives(tiny_model, api):
    path, body, keepalive, first, last = APIS[api]
    # the second turn, not streamed, outlasts any delay a loaded machine adds to the client's giving up
    upstream, adapter, server = serve(tiny_model, [dict(DONE, delay_s=TURN_S), dict(DONE, delay_s=60.0)])
    try:
        key = adapter.sessions.open().key
        timeout = httpx.Timeout(30, read=READ_TIMEOUT_S)
        # every gap between lines under the read timeout, or httpx raises ReadTimeout here
        status, lines = read_stream(server.url + path, {**body, "stream": True}, key, timeout, upstream)
        t0 = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):       # the same turn, not streamed: nothing to read until it ends
            httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)
        gave_up_after, answered_when_given_up = time.monotonic() - t0, list(upstream.answered)
        wait_until(lambda: httpx.get(server.url + "/healthz").json()["client_aborts"] == 1, 30, "the abort counted")
        result = adapter.sessions.finish(key)
    finally:
        server.stop()
        upstream.__exit__(None, None, None)
    assert status == 200
    beats = [i for i, (_, line) in enumerate(lines) if line.startswith(keepalive)]
    # the chat API's first chunk (the role) goes out at once, like the other APIs' opening events
    first_reply = [i for i, (_, line) in enumerate(lines) if line.startswith(first)][1 if api == "chat" else 0]
    assert lines[0][0] == 0                               # the response started before the model answered
    # then kept the line busy while the model worked (on a loaded machine one more may go out while the adapter
    # reads the model's answer: it is busy then too)
    assert sum(lines[i][0] == 0 for i in beats) >= 2
    assert max(beats) < first_reply and lines[first_reply][0] == 1        # until the reply, after the answer
    assert lines[-1][1].startswith(last)
    assert gave_up_after >= READ_TIMEOUT_S and answered_when_given_up == [1]    # gave up while the model worked
    assert len(result.chains) == 1 and result.stats["turns"] == 1      # the abandoned turn is not recorded


def test_the_openai_sdk_with_a_short_timeout_completes_a_long_streamed_responses_turn(tiny_model):
    openai = openai_sdk()
    upstream, adapter, server = serve(tiny_model, [dict(DONE, delay_s=TURN_S)] * 2)
    try:
        key = adapter.sessions.open().key
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, timeout=READ_TIMEOUT_S, max_retries=0)
        events = list(client.responses.create(model="m", input=ASK, stream=True))
        with pytest.raises(openai.APITimeoutError):
            client.responses.create(model="m", input=ASK)
    finally:
        server.stop()
        upstream.__exit__(None, None, None)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.count("keepalive") >= 2      # (and no gap past the client's timeout, or the SDK raises)
    assert events[-1].response.output[-1].content[0].text == "Done."


@pytest.mark.parametrize("api", sorted(APIS))
def test_an_upstream_failure_after_the_stream_started_is_reported_in_it(tiny_model, api):
    path, body, keepalive, _, _ = APIS[api]
    upstream, adapter, server = serve(tiny_model, [{"fail": 503, "delay_s": 1.0}, DONE])
    try:
        key = adapter.sessions.open().key
        status, lines = read_stream(server.url + path, {**body, "stream": True}, key, httpx.Timeout(30))
        retry = httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        stats = httpx.get(server.url + "/healthz").json()
        result = adapter.sessions.finish(key)
    finally:
        server.stop()
        upstream.__exit__(None, None, None)
    assert status == 200 and any(line.startswith(keepalive) for _, line in lines)
    last = json.loads(lines[-1][1].removeprefix("data: "))
    if api == "anthropic":
        assert lines[-2][1] == "event: error" and last["error"]["type"] == "overloaded_error"
    elif api == "chat":
        assert set(last) == {"error"} and last["error"]["type"] == "server_error"      # then the end: no [DONE]
    else:
        assert last["type"] == "response.failed" and last["response"]["error"]["code"] == "server_error"
        assert last["response"]["status"] == "failed"
    assert "the model server failed" in lines[-1][1] and stats["errors"] == 1
    assert retry.status_code == 200 and result.stats["turns"] == 1 and result.stats["upstream_errors"] == 1


def test_a_client_hanging_up_on_a_stream_aborts_its_turn(tiny_model):
    path, body, keepalive, _, _ = APIS["responses"]
    # the model's turn outlasts any delay a loaded machine adds: the abort must come while it is still on
    upstream, adapter, server = serve(tiny_model, [dict(DONE, delay_s=60.0)])
    try:
        key = adapter.sessions.open().key
        with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as r:
            next(line for line in r.iter_lines() if line.startswith(keepalive))
        wait_until(lambda: httpx.get(server.url + "/healthz").json()["client_aborts"] == 1, 30, "the abort counted")
        answered_at_abort = list(upstream.answered)
        turns = adapter.sessions.get(key).tree.turns
    finally:
        server.stop()
        upstream.__exit__(None, None, None)
    assert answered_at_abort == [] and turns == 0      # counted before the model answered, and nothing recorded
