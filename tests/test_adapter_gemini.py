"""Gemini's API of the adapter (`/v1beta/models/MODEL:generateContent`, `:streamGenerateContent?alt=sse`,
`:countTokens`), in process as tests/test_adapter_app.py: a client that echoes the replies back as Gemini CLI
does (thought parts dropped, each call's thoughtSignature returned) must come out as one exact sample, a
function response finds its call, and errors come in Google's shape. The real Gemini CLI is
tests/test_harness_gemini_cli.py."""

import asyncio
import json

import pytest
from test_adapter_app import STEPS, assert_one_exact_sample, finish, make, open_session

from agentrl.adapter.wire import WireError
from agentrl.adapter.wire_gemini import gemini_chat, split_target
from agentrl.adapter.wire_responses import reasoning_token

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}}
TOOLS = [{"functionDeclarations": [{"name": "Bash", "description": "Run a shell command",
                                    "parametersJsonSchema": SCHEMA}]}, {"googleSearch": {}}]
SYSTEM = {"parts": [{"text": "You are Gemini CLI."}]}
URL = "/v1beta/models/agentrl-tiny:streamGenerateContent?alt=sse"


def gemini_cli_echo(content: dict) -> dict:
    """What Gemini CLI sends back of a reply: the thought parts dropped, the rest (signatures too) kept."""
    return {"role": "model", "parts": [p for p in content["parts"] if not p.get("thought")]}


def responses_to(content: dict, output: str) -> dict:
    return {"role": "user", "parts": [{"functionResponse": {"id": p["functionCall"]["id"],
                                                            "name": p["functionCall"]["name"],
                                                            "response": {"output": output}}}
                                      for p in content["parts"] if "functionCall" in p]}


def events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("stream", [True, False])
def test_a_gemini_cli_like_tool_round_trip_is_one_exact_sample(tiny_model, stream):
    async def go():
        _, script, c = make(tiny_model, STEPS)
        key = await open_session(c)
        url = URL if stream else "/v1beta/models/agentrl-tiny:generateContent"
        contents = [{"role": "user", "parts": [{"text": "<session_context>...</session_context>"},
                                               {"text": "Fix the bug."}]}]
        replies = []
        for _ in STEPS:
            r = await c.post(url, json={"contents": contents, "systemInstruction": SYSTEM, "tools": TOOLS,
                                        "generationConfig": {"temperature": 1, "topP": 0.95, "topK": 64,
                                                             "thinkingConfig": {"includeThoughts": True}}},
                             headers={"x-goog-api-key": key})
            assert r.status_code == 200, r.text
            body = [e for e in events(r.text) if e.get("candidates")][-1] if stream else r.json()
            content = body["candidates"][0]["content"]
            replies.append(body)
            contents += [gemini_cli_echo(content), responses_to(content, "ok")]
        return replies, await finish(c, key), script
    replies, result, script = asyncio.run(go())
    assert_one_exact_sample(result, script)
    first = replies[0]["candidates"][0]
    thought, text, fn = first["content"]["parts"]
    assert thought == {"text": "Start by listing.", "thought": True,
                       "thoughtSignature": reasoning_token("Start by listing.")}
    assert text == {"text": "Let me look."} and fn["thoughtSignature"] == thought["thoughtSignature"]
    assert fn["functionCall"]["name"] == "Bash" and fn["functionCall"]["args"] == {"command": "ls -la\ncat README"}
    assert first["finishReason"] == "STOP" and replies[0]["usageMetadata"]["candidatesTokenCount"] > 0
    last = replies[-1]["candidates"][0]["content"]["parts"]           # text only: the signature on the text
    assert last[-1] == {"text": "Fixed: the off-by-one in `paginate`.",
                        "thoughtSignature": reasoning_token("Done.")}
    prompt = script.tok.decode(script.requests[0]["input_ids"])
    assert prompt.startswith("<|im_start|>system\nYou are Gemini CLI.\n\n# Tools")
    assert "<|im_start|>user\n<session_context>...</session_context>\nFix the bug.<|im_end|>" in prompt
    assert '"name": "Bash"' in prompt and "googleSearch" not in prompt
    assert script.requests[0]["sampling_params"]["top_k"] == 64


def test_reasoning_comes_from_our_signature_else_from_thought_parts():
    token = reasoning_token("  the sampled reasoning\n")
    history = [{"role": "user", "parts": [{"text": "hi"}]},
               {"role": "model", "parts": [{"text": "trimmed", "thought": True},
                                           {"functionCall": {"id": "c1", "name": "Bash", "args": {}},
                                            "thoughtSignature": token}]},
               {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "Bash",
                                                                "response": {"output": "a.py"}}},
                                          {"text": "and now?"}]},
               {"role": "model", "parts": [{"text": "theirs", "thought": True},
                                           {"text": "x", "thoughtSignature": "skip_thought_signature_validator"}]},
               {"role": "user", "parts": [{"text": "ok"}]}]
    chat = gemini_chat({"contents": history}, model="m", stream=False)
    roles = [m["role"] for m in chat.messages]
    assert roles == ["user", "assistant", "tool", "user", "assistant", "user"]
    assert chat.messages[1]["reasoning_content"] == "  the sampled reasoning\n"       # exact, not "trimmed"
    assert chat.messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "a.py"}
    assert chat.messages[4]["reasoning_content"] == "theirs" and chat.messages[4]["content"] == "x"


def test_a_function_response_without_an_id_answers_the_oldest_open_call_of_its_name():
    calls = [{"functionCall": {"name": "Bash", "args": {"n": i}}} for i in range(2)]
    answer = {"functionResponse": {"name": "Bash", "response": {"error": "boom"}}}
    chat = gemini_chat({"contents": [{"role": "user", "parts": [{"text": "go"}]}, {"role": "model", "parts": calls},
                                     {"role": "user", "parts": [answer, answer]}]}, model="m", stream=False)
    ids = [c["id"] for c in chat.messages[1]["tool_calls"]]
    assert [m["tool_call_id"] for m in chat.messages[2:]] == ids and len(set(ids)) == 2
    assert chat.messages[2]["content"] == '{"error": "boom"}'


@pytest.mark.parametrize("body, needle", [
    ({"contents": [{"role": "user", "parts": [{"functionResponse": {"id": "x", "name": "Bash"}}]}]},
     "functionResponse for no open functionCall (id 'x'"),
    ({"contents": [{"role": "robot", "parts": []}]}, "contents[0].role must be user or model, not 'robot'"),
    ({"contents": "hi"}, "contents must be a list"),
    ({"contents": [], "generationConfig": {"candidateCount": 2}}, "candidateCount must be 1"),
    ({"contents": [{"role": "model", "parts": [{"functionCall": {"name": "Bash", "args": [1]}}]}]},
     "contents[0].parts[0].functionCall.args must be an object"),
    ({"contents": [], "tools": [{"functionDeclarations": [{"description": "no name"}]}]},
     "tools[0].functionDeclarations[0].name must be a string"),
    ({"contents": [{"role": "model", "parts": [{"text": "x", "thoughtSignature": "agentrl-reasoning-v1:%%"}]}]},
     "contents[0].parts[0].thoughtSignature: holds the adapter's prefix but is corrupt"),
    ({"contents": [{"role": "model", "parts": [{"text": "x", "thoughtSignature": 7}]}]},
     "contents[0].parts[0].thoughtSignature: must be a string"),
])
def test_malformed_requests_are_refused_naming_the_place(body, needle):
    with pytest.raises(WireError, match=needle.replace("(", r"\(").replace("[", r"\[").replace("]", r"\]")):
        gemini_chat(body, model="m", stream=False)


def test_routes_and_errors_are_in_googles_shape(tiny_model):
    async def go():
        _, script, c = make(tiny_model, [STEPS[2]])
        key = await open_session(c)
        h = {"x-goog-api-key": key}
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "systemInstruction": SYSTEM}
        return (await c.post("/v1beta/models/m:streamGenerateContent", json=body, headers=h),
                await c.post("/v1beta/models/m:embedContent", json=body, headers=h),
                await c.post("/v1beta/models/m:generateContent", json=body),
                await c.post("/v1beta/models/m:generateContent", json={"contents": 1}, headers=h),
                await c.post("/v1beta/models/m:countTokens", json={"generateContentRequest": body}, headers=h),
                await c.post("/v1beta/models/m:generateContent", json=body, headers=h), script)
    no_sse, unknown, no_key, bad, count, ok, script = asyncio.run(go())
    for r, status, code in ((no_sse, 400, "INVALID_ARGUMENT"), (unknown, 404, "NOT_FOUND"),
                            (no_key, 401, "UNAUTHENTICATED"), (bad, 400, "INVALID_ARGUMENT")):
        assert r.status_code == status and r.json()["error"]["status"] == code, r.text
        assert r.json()["error"]["code"] == status
    assert "alt=sse" in no_sse.json()["error"]["message"]
    assert "m:embedContent: the adapter serves models/MODEL:generateContent" in unknown.json()["error"]["message"]
    assert count.status_code == 200 and count.json()["totalTokens"] > 5
    assert ok.status_code == 200 and len(script.requests) == 1
    assert ok.json()["modelVersion"] == "m"


def test_a_body_over_the_limit_is_refused_in_googles_shape(tiny_model):
    async def go():
        _, script, c = make(tiny_model, [STEPS[2]], max_body_bytes=4096)
        key = await open_session(c)
        big = {"contents": [{"role": "user", "parts": [{"text": "x" * 8192}]}]}
        return await c.post(URL, json=big, headers={"x-goog-api-key": key}), script
    r, script = asyncio.run(go())
    assert r.status_code == 413 and r.json()["error"]["status"] == "INVALID_ARGUMENT", r.text
    assert "max_body_bytes" in r.json()["error"]["message"] and script.requests == []


def test_split_target():
    assert split_target("gemini-2.5-pro:streamGenerateContent") == ("gemini-2.5-pro", "streamGenerateContent")
    for bad in ("m", ":generateContent", "m:embedContent"):
        with pytest.raises(WireError, match="serves models/MODEL:generateContent"):
            split_target(bad)
