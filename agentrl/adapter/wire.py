"""Anthropic and OpenAI chat wire formats <-> chat-template messages, both ways (pure).

The OpenAI Responses API is wire_responses.py's, on the same `Chat` and helpers.

Requests become `Chat`: HF-style messages (`role`, `content`, `reasoning_content`,
`tool_calls` with dict arguments, `tool_call_id`), tools in OpenAI function form, and the
sampling keys the body set. Replies are built from the parsed model output.

What the next request echoes back must re-render to the ids that were sampled, so an
assistant message keeps its text content, its reasoning (read from `reasoning_content` or
`reasoning`, or Anthropic thinking blocks) and its tool calls together; the reply puts all
three on the wire. Fields a CLI sends that do not apply (metadata, thinking, beta flags)
are ignored; what cannot be understood is a `WireError` (HTTP 400) that says what is wrong.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .limits import sampling_values
from .parsers import ParsedOutput

IMAGE_PLACEHOLDER = "[image omitted: this model reads text only]"
THINKING_SIGNATURE = "agentrl"   # Anthropic clients echo thinking blocks with a signature


class WireError(ValueError):
    """A request the adapter cannot serve; the message is for the client (HTTP 400), `param` the field at fault."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class Chat:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)   # only the keys the body set
    stream: bool = False
    model: str = ""
    include_usage: bool = False
    call_id_prefix: str = "call_"      # what this API's tool-call ids look like
    options: dict[str, Any] = field(default_factory=dict)    # request fields the reply repeats (Responses API)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise WireError(msg)


def _as_dict(body: Any) -> Mapping[str, Any]:
    _need(isinstance(body, Mapping), "the request body must be a JSON object")
    return body


def _list(value: Any, where: str) -> list:
    _need(isinstance(value, list), f"{where} must be a list")
    return value


def _text_of(content: Any, where: str) -> str:
    """A content that is a string or a list of text (and image) blocks, as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for i, block in enumerate(_list(content, where)):
        _need(isinstance(block, Mapping), f"{where}[{i}] must be an object")
        kind = block.get("type")
        if kind == "text":
            _need(isinstance(block.get("text"), str), f"{where}[{i}].text must be a string")
            parts.append(block["text"])
        elif kind in ("image", "image_url", "document", "input_image"):
            parts.append(IMAGE_PLACEHOLDER)
        elif isinstance(kind, str):
            # Refusing makes Claude Code resend a different request (docs/agent-clis.md): keep a marker.
            parts.append(f"[{kind} block omitted]")
        else:
            raise WireError(f"{where}[{i}] has no type")
    return "\n".join(parts)


def _sampling(body: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, Any]:
    """The sampling values the body set, in SGLang's names, checked (`limits.Sampling`)."""
    values, names = {}, {}
    for wire, ours in keys.items():
        if body.get(wire) is not None:
            values[ours], names[ours] = body[wire], wire
    try:
        return sampling_values(values, names)
    except ValueError as e:
        raise WireError(str(e)) from None


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    _need(value is None or isinstance(value, bool), f"{key} must be true or false")
    return bool(value)


def _model(body: Mapping[str, Any]) -> str:
    value = body.get("model")
    _need(value is None or isinstance(value, str), "model must be a string")
    return value or ""


# ---------------------------------------------------------------- Anthropic /v1/messages

_ANTHROPIC_SAMPLING = {"max_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p",
                       "top_k": "top_k", "stop_sequences": "stop"}


def anthropic_chat(body: Any) -> Chat:
    body = _as_dict(body)
    _need(isinstance(body.get("max_tokens"), int), "max_tokens is required and must be an integer")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(system, "system")})
    known_ids: set[str] = set()
    for i, msg in enumerate(_list(body.get("messages"), "messages")):
        where = f"messages[{i}]"
        _need(isinstance(msg, Mapping), f"{where} must be an object")
        role, content = msg.get("role"), msg.get("content")
        if role == "assistant":
            messages.append(_anthropic_assistant(content, where, known_ids))
        elif role == "user":
            messages += _anthropic_user(content, where, known_ids)
        elif role == "system":
            messages.append({"role": "system", "content": _text_of(content, f"{where}.content")})
        else:
            raise WireError(f"{where}.role must be 'user' or 'assistant', not {role!r}")
    tools = []
    for i, tool in enumerate(_list(body.get("tools") or [], "tools")):
        _need(isinstance(tool, Mapping) and isinstance(tool.get("name"), str), f"tools[{i}] needs a name")
        if "input_schema" not in tool:
            continue   # a server tool (web search, ...): not the model's to call here
        tools.append({"type": "function", "function": {"name": tool["name"],
                                                        "description": tool.get("description", ""),
                                                        "parameters": tool["input_schema"]}})
    return Chat(messages, tools, _sampling(body, _ANTHROPIC_SAMPLING), _flag(body, "stream"), _model(body),
                call_id_prefix="toolu_")


def _anthropic_assistant(content: Any, where: str, known_ids: set[str]) -> dict[str, Any]:
    if content is None or isinstance(content, str):
        return {"role": "assistant", "content": content or ""}
    text, reasoning, calls = [], [], []
    for j, block in enumerate(_list(content, f"{where}.content")):
        _need(isinstance(block, Mapping), f"{where}.content[{j}] must be an object")
        kind = block.get("type")
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            _need(isinstance(block.get("id"), str) and isinstance(block.get("name"), str),
                  f"{where}.content[{j}]: a tool_use block needs an id and a name")
            args = block.get("input", {})
            _need(isinstance(args, Mapping), f"{where}.content[{j}].input must be an object")
            known_ids.add(block["id"])
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": dict(args)}})
        else:
            raise WireError(f"{where}.content[{j}]: unsupported block type {kind!r} in an assistant message")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if reasoning:
        msg["reasoning_content"] = "".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _anthropic_user(content: Any, where: str, known_ids: set[str]) -> list[dict[str, Any]]:
    if content is None or isinstance(content, str):
        return [{"role": "user", "content": content or ""}]
    results, rest = [], []
    for j, block in enumerate(_list(content, f"{where}.content")):
        _need(isinstance(block, Mapping), f"{where}.content[{j}] must be an object")
        if block.get("type") == "tool_result":
            tid = block.get("tool_use_id")
            _need(tid in known_ids, f"{where}.content[{j}]: tool_result for unknown tool_use_id {tid!r}")
            results.append({"role": "tool", "tool_call_id": tid,
                            "content": _text_of(block.get("content"), f"{where}.content[{j}].content")})
        else:
            rest.append(block)
    # Tool results answer the previous turn, so they come first; any text after them is a new user turn.
    return results + ([{"role": "user", "content": _text_of(rest, f"{where}.content")}] if rest else [])


def anthropic_reply(parsed: ParsedOutput, finish: str, *, model: str, usage: Mapping[str, int],
                    ids: list[str]) -> dict[str, Any]:
    """A Messages API response; `ids` are the tool_use ids, one per tool call."""
    return {"id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant", "model": model,
            "content": anthropic_blocks(parsed, ids), "stop_reason": anthropic_stop_reason(parsed, finish),
            "stop_sequence": None,
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}}


def anthropic_blocks(parsed: ParsedOutput, ids: list[str]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if parsed.reasoning:
        blocks.append({"type": "thinking", "thinking": parsed.reasoning, "signature": THINKING_SIGNATURE})
    if parsed.content or not parsed.tool_calls:
        blocks.append({"type": "text", "text": parsed.content})
    blocks += [{"type": "tool_use", "id": tid, "name": call.name, "input": call.arguments}
               for tid, call in zip(ids, parsed.tool_calls, strict=True)]
    return blocks


def anthropic_stop_reason(parsed: ParsedOutput, finish: str) -> str:
    if finish == "length":
        return "max_tokens"
    return "tool_use" if parsed.tool_calls else "end_turn"


def new_tool_ids(parsed: ParsedOutput, prefix: str) -> list[str]:
    """Fresh ids: a CLI that sees an id twice in one conversation drops the second call (Claude Code)."""
    return [f"{prefix}{secrets.token_hex(12)}" for _ in parsed.tool_calls]


def reply_message(parsed: ParsedOutput, ids: list[str]) -> dict[str, Any]:
    """Our reply as a chat-template message, in the form the translators give an echo of it."""
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning:
        msg["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        msg["tool_calls"] = [{"id": tid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for tid, c in zip(ids, parsed.tool_calls, strict=True)]
    return msg


# ---------------------------------------------------------------- OpenAI /v1/chat/completions

_OPENAI_SAMPLING = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
                    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "stop": "stop",
                    "seed": "sampling_seed"}   # SGLang's name for it


def openai_chat(body: Any) -> Chat:
    body = _as_dict(body)
    _need(body.get("n") in (None, 1), "n must be 1: one sampled completion per request")
    messages: list[dict[str, Any]] = []
    known_ids: set[str] = set()
    for i, msg in enumerate(_list(body.get("messages"), "messages")):
        where = f"messages[{i}]"
        _need(isinstance(msg, Mapping), f"{where} must be an object")
        role = msg.get("role")
        if role in ("system", "developer", "user"):
            messages.append({"role": "user" if role == "user" else "system",
                             "content": _text_of(msg.get("content"), f"{where}.content")})
        elif role == "assistant":
            messages.append(_openai_assistant(msg, where, known_ids))
        elif role == "tool":
            tid = msg.get("tool_call_id")
            _need(tid in known_ids, f"{where}: tool message for unknown tool_call_id {tid!r}")
            messages.append({"role": "tool", "tool_call_id": tid,
                             "content": _text_of(msg.get("content"), f"{where}.content")})
        else:
            raise WireError(f"{where}.role must be system, developer, user, assistant or tool, not {role!r}")
    tools = []
    for i, tool in enumerate(_list(body.get("tools") or [], "tools")):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not (isinstance(fn, Mapping) and isinstance(fn.get("name"), str)):
            raise WireError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
        tools.append({"type": "function", "function": {"name": fn["name"], "description": fn.get("description", ""),
                                                        "parameters": fn.get("parameters", {})}})
    options = body.get("stream_options") or {}
    _need(isinstance(options, Mapping), "stream_options must be an object")
    return Chat(messages, tools, _sampling(body, _OPENAI_SAMPLING), _flag(body, "stream"), _model(body),
                _flag(options, "include_usage"))


def _openai_assistant(msg: Mapping[str, Any], where: str, known_ids: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": _text_of(msg.get("content"), f"{where}.content")}
    # The spec names neither; clients echo our reasoning_content under either key.
    reasoning = msg.get("reasoning_content")
    if reasoning is None:
        reasoning = msg.get("reasoning")
    if reasoning:
        _need(isinstance(reasoning, str), f"{where}.reasoning_content must be a string")
        out["reasoning_content"] = reasoning
    calls = []
    for j, call in enumerate(_list(msg.get("tool_calls") or [], f"{where}.tool_calls")):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not (isinstance(fn, Mapping) and isinstance(fn.get("name"), str) and isinstance(call.get("id"), str)):
            raise WireError(f"{where}.tool_calls[{j}] needs an id and function.name")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except ValueError:
                raise WireError(f"{where}.tool_calls[{j}].function.arguments is not valid JSON") from None
        _need(isinstance(args, Mapping), f"{where}.tool_calls[{j}].function.arguments must be a JSON object")
        known_ids.add(call["id"])
        calls.append({"id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": dict(args)}})
    if calls:
        out["tool_calls"] = calls
    return out


def openai_message(parsed: ParsedOutput, ids: list[str]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content or (None if parsed.tool_calls else "")}
    if parsed.reasoning:
        msg["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        msg["tool_calls"] = [{"id": tid, "type": "function",
                              "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                             for tid, c in zip(ids, parsed.tool_calls, strict=True)]
    return msg


def openai_finish_reason(parsed: ParsedOutput, finish: str) -> str:
    if finish == "length":
        return "length"
    return "tool_calls" if parsed.tool_calls else "stop"


def openai_usage(usage: Mapping[str, int]) -> dict[str, int]:
    return {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
