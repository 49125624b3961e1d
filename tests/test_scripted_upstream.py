"""The scripted SGLang stand-in answers in SGLang's shape, from its script, and records what it was asked."""

from __future__ import annotations

import time

import httpx
import pytest
from scripted_upstream import ScriptedUpstream, logprob

from agentrl.models.tiny import assistant_text

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

TOOL_TURN = {"role": "assistant", "content": "Looking.", "reasoning_content": "Where is it?",
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "bash", "arguments": {"command": "ls -a"}}}]}
TEXT_TURN = {"role": "assistant", "content": "Fixed it."}


def generate(upstream: ScriptedUpstream, input_ids=(1, 2, 3), **sampling) -> httpx.Response:
    body = {"input_ids": list(input_ids), "sampling_params": {"temperature": 1.0, **sampling},
            "return_logprob": True, "rid": "r1"}
    return httpx.post(f"{upstream.url}/generate", json=body, timeout=10)


def test_output_ids_decode_to_the_scripted_turn_and_end_with_the_stop_token(tiny_model):
    with ScriptedUpstream(tiny_model, [TOOL_TURN, TEXT_TURN]) as upstream:
        replies = [generate(upstream).json() for _ in range(2)]
    tok, stop = upstream.tokenizer, upstream.stop_id
    for reply, turn in zip(replies, [TOOL_TURN, TEXT_TURN], strict=True):
        ids, meta = reply["output_ids"], reply["meta_info"]
        assert ids[-1] == stop and stop not in ids[:-1]
        assert tok.decode(ids[:-1]) == reply["text"] == assistant_text(turn)
        assert meta["finish_reason"] == {"type": "stop", "matched": stop}
        assert meta["output_token_logprobs"] == [[logprob(i, t), t, None] for i, t in enumerate(ids)]
        assert (meta["id"], meta["prompt_tokens"], meta["completion_tokens"]) == ("r1", 3, len(ids))
    assert tok.convert_tokens_to_ids("<tool_call>") in replies[0]["output_ids"]


def test_max_new_tokens_truncates_without_a_stop_token(tiny_model):
    with ScriptedUpstream(tiny_model, [TOOL_TURN, TOOL_TURN]) as upstream:
        full = upstream.output_ids(TOOL_TURN)
        short = generate(upstream, max_new_tokens=5).json()
        # SGLang checks length before stop tokens: a stop token that is the last allowed one ends in "length".
        exact = generate(upstream, max_new_tokens=len(full)).json()
    assert short["output_ids"] == full[:5]
    assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert short["meta_info"]["completion_tokens"] == len(short["meta_info"]["output_token_logprobs"]) == 5
    assert exact["output_ids"] == full
    assert exact["meta_info"]["finish_reason"] == {"type": "length", "length": len(full)}


def test_failures_delays_callables_and_an_exhausted_script(tiny_model):
    seen = []

    def echo_prompt_length(body):
        seen.append(body["input_ids"])
        return {"role": "assistant", "content": f"{len(body['input_ids'])} tokens"}

    script = [{"fail": 503}, {"delay_s": 0.3, **TEXT_TURN}, echo_prompt_length]
    with ScriptedUpstream(tiny_model, script) as upstream:
        failed = generate(upstream)
        t0 = time.monotonic()
        delayed = generate(upstream)
        elapsed = time.monotonic() - t0
        called = generate(upstream, input_ids=[5] * 7)
        exhausted = generate(upstream)
    assert failed.status_code == 503 and "call 1" in failed.json()["error"]["message"]
    assert delayed.status_code == 200 and delayed.json()["text"] == "Fixed it." and elapsed >= 0.3
    assert called.json()["text"] == "7 tokens" and seen == [[5] * 7]
    assert exhausted.status_code == 500
    assert exhausted.json()["error"]["message"] == "script exhausted: /generate call 4 has no step (3 were scripted)"


def test_requests_are_recorded_and_the_info_routes_answer(tiny_model):
    with ScriptedUpstream(tiny_model, weight_version="7") as upstream:
        upstream.push(TEXT_TURN)
        reply = generate(upstream, input_ids=[9, 8], max_new_tokens=64, stop_token_ids=[upstream.stop_id]).json()
        health = httpx.get(f"{upstream.url}/health")
        info = httpx.get(f"{upstream.url}/get_model_info").json()
    assert [(r["input_ids"], r["sampling_params"]) for r in upstream.requests] == [
        ([9, 8], {"temperature": 1.0, "max_new_tokens": 64, "stop_token_ids": [upstream.stop_id]})]
    assert reply["meta_info"]["weight_version"] == "7"
    assert health.status_code == 200
    assert info == {"model_path": str(tiny_model), "tokenizer_path": str(tiny_model), "is_generation": True,
                    "weight_version": "7"}
    with pytest.raises(httpx.ConnectError):  # stopped for good when the block ends
        httpx.get(f"{upstream.url}/health")
