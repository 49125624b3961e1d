"""Gemini's API (`POST /v1beta/models/MODEL:generateContent` and `:streamGenerateContent?alt=sse`) <->
chat-template messages, both ways (pure). Gemini CLI speaks it (docs/agent-clis.md, "Gemini CLI").

A request's `contents` alternate `user` and `model` turns of `parts`:
- a model turn's `text` parts are its content, its `thought` parts (text with `"thought": true`) its
  reasoning, each joined in order; its `functionCall` parts ({id, name, args}) its tool calls;
- a user turn's `functionResponse` parts ({id, name, response}) are tool messages, its `text` parts a
  user message (joined by newlines), in that order;
- `systemInstruction` is the system message; `tools[].functionDeclarations` the tools (`parameters`
  or `parametersJsonSchema`); other tools (Google Search, code execution) are not the model's to call
  here and are left out.
So an echoed history has the form wire.py gives the other APIs, and goes through the same echo restorer
(echo.py) and render. A function response names its call by id (Gemini CLI sends the id it was given),
else by name: the oldest call of that name still without a response.

Our reply is one candidate: the reasoning as a thought part, then the text, then each call as a
`functionCall` with its id. A `thoughtSignature` holds the reasoning exactly (wire_responses' reasoning
token), on the thought part and on the first call (else the last part): Gemini CLI drops thought parts
from the history it sends back but returns a call's signature, so the echo re-renders to the sampled ids.
`generationConfig`'s maxOutputTokens, temperature, topP, topK, stopSequences and seed are sampling; the
rest (thinkingConfig, responseMimeType, responseSchema, candidateCount 1) does not apply here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .parsers import ParsedOutput
from .wire import Chat, WireError, _list, _need, _sampling
from .wire_responses import read_token, reasoning_token

_SAMPLING = {"maxOutputTokens": "max_new_tokens", "temperature": "temperature", "topP": "top_p", "topK": "top_k",
             "stopSequences": "stop", "seed": "sampling_seed"}
METHODS = ("generateContent", "streamGenerateContent", "countTokens")
# Google's error statuses by HTTP code (google.rpc.Code), for replies in the API's own shape
STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
          408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
          499: "CANCELLED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


class UnknownMethod(WireError):
    """A models/MODEL:METHOD path whose method the adapter does not serve (404)."""


def _obj(value: Any, where: str) -> Mapping[str, Any]:
    _need(isinstance(value, Mapping), f"{where} must be an object")
    return value


def _text(part: Mapping[str, Any], where: str) -> str:
    _need(isinstance(part["text"], str), f"{where}.text must be a string")
    return part["text"]


def split_target(target: str) -> tuple[str, str]:
    """`MODEL:METHOD` from the path, refused unless METHOD is one this adapter serves."""
    model, sep, method = target.rpartition(":")
    if not sep or not model or method not in METHODS:
        raise UnknownMethod(f"models/{target}: the adapter serves models/MODEL:{', :'.join(METHODS)}")
    return model, method


def gemini_chat(body: Any, *, model: str, stream: bool) -> Chat:
    body = _obj(body, "the request body")
    messages: list[dict[str, Any]] = []
    system = body.get("systemInstruction")
    if system is not None:
        texts = [_text(p, f"systemInstruction.parts[{j}]") for j, p in
                 enumerate(_list(_obj(system, "systemInstruction").get("parts") or [], "systemInstruction.parts"))
                 if isinstance(p, Mapping) and "text" in p]
        messages.append({"role": "system", "content": "\n".join(texts)})
    open_calls: list[tuple[str, str]] = []       # (id, name) of calls not yet answered, oldest first
    for i, content in enumerate(_list(body.get("contents"), "contents")):
        where = f"contents[{i}]"
        content = _obj(content, where)
        parts = [_obj(p, f"{where}.parts[{j}]") for j, p in enumerate(_list(content.get("parts") or [],
                                                                             f"{where}.parts"))]
        role = content.get("role", "user")
        if role == "model":
            message = _model_turn(parts, where)
            open_calls += [(c["id"], c["function"]["name"]) for c in message.get("tool_calls", [])]
            messages.append(message)
        elif role == "user":
            messages += _user_turn(parts, where, open_calls)
        else:
            raise WireError(f"{where}.role must be user or model, not {role!r}")
    tools = []
    for i, tool in enumerate(_list(body.get("tools") or [], "tools")):
        for j, fn in enumerate(_list(_obj(tool, f"tools[{i}]").get("functionDeclarations") or [],
                                     f"tools[{i}].functionDeclarations")):
            where = f"tools[{i}].functionDeclarations[{j}]"
            fn = _obj(fn, where)
            _need(isinstance(fn.get("name"), str), f"{where}.name must be a string")
            schema = fn.get("parametersJsonSchema", fn.get("parameters")) or {"type": "object", "properties": {}}
            tools.append({"type": "function", "function": {"name": fn["name"], "description": fn.get("description", ""),
                                                            "parameters": schema}})
    config = _obj(body.get("generationConfig") or {}, "generationConfig")
    _need(config.get("candidateCount") in (None, 1), "generationConfig.candidateCount must be 1")
    return Chat(messages, tools, _sampling(config, _SAMPLING), stream, model, call_id_prefix="call_")


def _model_turn(parts: list[Mapping[str, Any]], where: str) -> dict[str, Any]:
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    signed: str | None = None
    for j, part in enumerate(parts):
        here = f"{where}.parts[{j}]"
        token = read_token(part.get("thoughtSignature"), f"{here}.thoughtSignature")
        signed = token if token is not None else signed
        if "functionCall" in part:
            call = _obj(part["functionCall"], f"{here}.functionCall")
            _need(isinstance(call.get("name"), str), f"{here}.functionCall.name must be a string")
            args = call.get("args") or {}
            _need(isinstance(args, Mapping), f"{here}.functionCall.args must be an object")
            cid = call.get("id") or f"{call['name']}#{len(calls)}"
            _need(isinstance(cid, str), f"{here}.functionCall.id must be a string")
            calls.append({"id": cid, "type": "function", "function": {"name": call["name"], "arguments": dict(args)}})
        elif "text" in part:
            (reasoning if part.get("thought") else text).append(_text(part, here))
    out: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    # Our signature holds the reasoning exactly: it wins over thought text a client may have trimmed or dropped.
    thought = signed if signed is not None else "".join(reasoning)
    if thought:
        out["reasoning_content"] = thought
    if calls:
        out["tool_calls"] = calls
    return out


def _user_turn(parts: list[Mapping[str, Any]], where: str, open_calls: list[tuple[str, str]]) -> list[dict[str, Any]]:
    tools, texts = [], []
    for j, part in enumerate(parts):
        here = f"{where}.parts[{j}]"
        if "functionResponse" in part:
            resp = _obj(part["functionResponse"], f"{here}.functionResponse")
            cid, name = resp.get("id"), resp.get("name")
            match = next((k for k, (i, n) in enumerate(open_calls) if (cid and i == cid) or (not cid and n == name)),
                         None)
            _need(match is not None, f"{here}: functionResponse for no open functionCall (id {cid!r}, name {name!r})")
            call_id, _ = open_calls.pop(match)   # type: ignore[arg-type]
            tools.append({"role": "tool", "tool_call_id": call_id, "content": _response_text(resp.get("response"))})
        elif "text" in part:
            texts.append(_text(part, here))
    return tools + ([{"role": "user", "content": "\n".join(texts)}] if texts or not tools else [])


def _response_text(response: Any) -> str:
    """A function response as the model reads it: Gemini CLI's {"output": TEXT} as the text, else JSON."""
    if isinstance(response, Mapping) and set(response) == {"output"} and isinstance(response["output"], str):
        return response["output"]
    return json.dumps(response, ensure_ascii=False)


def reply_content(parsed: ParsedOutput, ids: list[str]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if parsed.content:
        parts.append({"text": parsed.content})
    for cid, call in zip(ids, parsed.tool_calls, strict=True):
        parts.append({"functionCall": {"id": cid, "name": call.name, "args": call.arguments}})
    if not parsed.reasoning:
        return {"role": "model", "parts": parts or [{"text": ""}]}
    # The signature goes where Gemini puts its own, on the first function call (else the last part), for
    # clients that drop thought parts from their history but return signatures: Gemini CLI does.
    token = reasoning_token(parsed.reasoning)
    thought = {"text": parsed.reasoning, "thought": True, "thoughtSignature": token}
    if parts:
        carrier = next((p for p in parts if "functionCall" in p), parts[-1])
        carrier["thoughtSignature"] = token
    return {"role": "model", "parts": [thought, *parts]}


def finish_reason(finish: str) -> str:
    return "MAX_TOKENS" if finish == "length" else "STOP"


def reply(parsed: ParsedOutput, finish: str, *, ids: list[str], usage: Mapping[str, int], model: str,
          rid: str) -> dict[str, Any]:
    """A GenerateContentResponse; streamed, the same object is the one event."""
    return {"candidates": [{"content": reply_content(parsed, ids), "finishReason": finish_reason(finish), "index": 0}],
            "usageMetadata": {"promptTokenCount": usage["prompt_tokens"],
                              "candidatesTokenCount": usage["completion_tokens"],
                              "totalTokenCount": usage["prompt_tokens"] + usage["completion_tokens"]},
            "modelVersion": model, "responseId": rid}


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": STATUS.get(status, "UNKNOWN")}}
