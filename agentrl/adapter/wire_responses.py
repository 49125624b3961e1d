"""OpenAI Responses API (`POST /v1/responses`) <-> chat-template messages, both ways (pure).

A request's `input` is a list of items, and one assistant turn is several of them, in the order
the reply gave them: a `reasoning` item, a `message` of `output_text` parts, `function_call`
items. They are merged back into one assistant chat message (`reasoning_content`, `content`,
`tool_calls` keyed by `call_id`), the form wire.py gives the other two APIs, so an echoed
history goes through the same echo restorer (echo.py) and renders to the ids that were sampled.
A new turn starts where an item comes that cannot follow the previous one in a reply (a second
reasoning item or message, a reasoning item or message after a call) or at any other item.

Reasoning goes out as the reasoning item's `content` (`reasoning_text`), the raw text, and as
`encrypted_content`: an opaque token that holds that text exactly (`reasoning_token`). Codex
sends `include: ["reasoning.encrypted_content"]` and `store: false`, and echoes a reasoning
item's `summary` and `encrypted_content` but never its `reasoning_text` content; the token
gives the sampled reasoning back, so the turn re-renders to its sampled ids. Read back, the
token wins over `content` (as the API's own encrypted reasoning does); a token the adapter did
not issue is ignored; a `summary` is never taken for the reasoning.

Nothing is stored: `previous_response_id` and `conversation` are refused (400) whatever `store`
says, and so is an `item_reference`; the client must send the whole conversation as `input`.
Tools other than `function` ones (web search, custom or hosted tools) are not the model's to
call here and are left out, as are fields that do not apply (`include`, `prompt_cache_key`,
`tool_choice`, `parallel_tool_calls`, `text`, `metadata`; the reply repeats them).
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Mapping
from typing import Any

from .parsers import ParsedOutput
from .wire import IMAGE_PLACEHOLDER, Chat, WireError, _as_dict, _flag, _list, _model, _sampling

REASONING_TOKEN_PREFIX = "agentrl-reasoning-v1:"
_SAMPLING = {"max_output_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p"}
_REPEATED = ("instructions", "tools", "tool_choice", "parallel_tool_calls", "reasoning", "text", "max_output_tokens",
             "temperature", "top_p", "metadata", "prompt_cache_key", "truncation", "user", "service_tier")
_RANK = {"reasoning": 0, "message": 1, "function_call": 2}    # their order within one reply


def _bad(where: str, message: str) -> WireError:
    return WireError(f"{where}: {message}", param=where)


def reasoning_token(reasoning: str) -> str:
    """The `encrypted_content` of a reasoning item: its text, exactly, for the adapter to read back."""
    return REASONING_TOKEN_PREFIX + base64.urlsafe_b64encode(reasoning.encode()).decode("ascii")


def read_token(token: Any, where: str) -> str | None:
    """The reasoning a token of ours holds; None for no token or another issuer's. `where` names the field
    (a Responses item's encrypted_content, a Gemini part's thoughtSignature)."""
    if token is None:
        return None
    if not isinstance(token, str):
        raise _bad(where, "must be a string")
    if not token.startswith(REASONING_TOKEN_PREFIX):
        return None
    try:
        return base64.b64decode(token[len(REASONING_TOKEN_PREFIX):], altchars=b"-_", validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise _bad(where, "holds the adapter's prefix but is corrupt: echo it as it was sent") from None


# ---------------------------------------------------------------- requests

def responses_chat(body: Any) -> Chat:
    body = _as_dict(body)
    for key in ("previous_response_id", "conversation"):
        if body.get(key) is not None:
            raise WireError(f"{key} is not supported: the adapter stores no responses (whatever `store` says), so "
                            "send the whole conversation as `input`", param=key)
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise WireError("instructions must be a string", param="instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    else:
        messages += _items(_list(raw, "input"))
    return Chat(messages, _tools(body.get("tools") or []), _sampling(body, _SAMPLING), _flag(body, "stream"),
                _model(body), call_id_prefix="call_", options={k: body[k] for k in _REPEATED if k in body})


def _items(items: list) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    known_ids: set[str] = set()
    turn: dict[str, Any] | None = None      # the assistant message the items of one reply build
    rank = -1
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise _bad(where, "an input item must be an object")
        kind, role = item.get("type", "message" if "role" in item else None), item.get("role")
        if kind in ("reasoning", "function_call") or (kind == "message" and role == "assistant"):
            r = _RANK[kind]
            if turn is None or r < rank or (r == rank and r < _RANK["function_call"]):
                turn = {"role": "assistant", "content": ""}
                messages.append(turn)
            rank = r
            if kind == "message":
                turn["content"] = _text(item.get("content"), f"{where}.content", "")
            elif kind == "reasoning":
                reasoning = _reasoning(item, where)
                if reasoning:
                    turn["reasoning_content"] = reasoning
            else:
                turn.setdefault("tool_calls", []).append(_function_call(item, where, known_ids))
            continue
        turn = None
        if kind == "message":
            if role not in ("user", "system", "developer"):
                raise _bad(f"{where}.role", f"must be user, system, developer or assistant, not {role!r}")
            messages.append({"role": "user" if role == "user" else "system",
                             "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call_output":
            cid = item.get("call_id")
            if cid not in known_ids:
                raise _bad(where, f"function_call_output for unknown call_id {cid!r}: no function_call before it "
                                  "has it")
            messages.append({"role": "tool", "tool_call_id": cid,
                             "content": _text(item.get("output"), f"{where}.output")})
        elif kind == "item_reference":
            raise _bad(where, "an item_reference names a stored item, and the adapter stores none: send the item "
                              "itself")
        else:
            raise _bad(where, f"unsupported input item type {kind!r}: the adapter takes message, reasoning, "
                              "function_call and function_call_output items")
    return messages


def _text(content: Any, where: str, sep: str = "\n") -> str:
    """A content that is a string or a list of text (and image or file) parts, as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(_list(content, where)):
        if not isinstance(part, Mapping):
            raise _bad(f"{where}[{j}]", "must be an object")
        kind = part.get("type")
        key = "refusal" if kind == "refusal" else "text"
        if kind in ("input_text", "output_text", "text", "refusal"):
            if not isinstance(part.get(key), str):
                raise _bad(f"{where}[{j}].{key}", "must be a string")
            parts.append(part[key])
        elif kind == "input_image":
            parts.append(IMAGE_PLACEHOLDER)
        elif isinstance(kind, str):
            parts.append(f"[{kind} part omitted]")
        else:
            raise _bad(f"{where}[{j}]", "has no type")
    return sep.join(parts)


def _reasoning(item: Mapping[str, Any], where: str) -> str:
    restored = read_token(item.get("encrypted_content"), f"{where}.encrypted_content")
    if restored is not None:
        return restored
    texts = []
    for j, part in enumerate(_list(item.get("content") or [], f"{where}.content")):
        if not (isinstance(part, Mapping) and isinstance(part.get("text"), str)):
            raise _bad(f"{where}.content[{j}]", "must be {'type': 'reasoning_text', 'text': ...}")
        texts.append(part["text"])
    return "".join(texts)


def _function_call(item: Mapping[str, Any], where: str, known_ids: set[str]) -> dict[str, Any]:
    cid, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
    if not (isinstance(cid, str) and cid and isinstance(name, str) and name):
        raise _bad(where, "a function_call needs a call_id and a name")
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except ValueError:
            raise _bad(f"{where}.arguments", "is not valid JSON") from None
    if not isinstance(args, Mapping):
        raise _bad(f"{where}.arguments", "must be a JSON object")
    known_ids.add(cid)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": dict(args)}}


def _tools(raw: Any) -> list[dict[str, Any]]:
    tools = []
    for i, tool in enumerate(_list(raw, "tools")):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise _bad(where, "must be an object")
        if tool.get("type") != "function":
            continue     # a built-in, hosted or custom tool: not the model's to call here
        parameters = tool.get("parameters") or {}
        if not (isinstance(tool.get("name"), str) and tool["name"] and isinstance(parameters, Mapping)):
            raise _bad(where, "a function tool needs a name, and its parameters must be a JSON schema object")
        tools.append({"type": "function", "function": {"name": tool["name"],
                                                        "description": tool.get("description") or "",
                                                        "parameters": parameters}})
    return tools


# ---------------------------------------------------------------- replies

def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def output_items(parsed: ParsedOutput, ids: list[str], finish: str) -> list[dict[str, Any]]:
    """The reply's output items; `ids` are the call_ids, one per tool call."""
    items: list[dict[str, Any]] = []
    if parsed.reasoning:
        items.append({"type": "reasoning", "id": new_id("rs_"), "summary": [],
                      "content": [{"type": "reasoning_text", "text": parsed.reasoning}],
                      "encrypted_content": reasoning_token(parsed.reasoning), "status": "completed"})
    if parsed.content or not parsed.tool_calls:
        items.append({"type": "message", "id": new_id("msg_"), "role": "assistant",
                      "status": "incomplete" if finish == "length" else "completed",
                      "content": [{"type": "output_text", "text": parsed.content, "annotations": [], "logprobs": []}]})
    items += [{"type": "function_call", "id": new_id("fc_"), "call_id": cid, "name": call.name,
               "arguments": json.dumps(call.arguments, ensure_ascii=False), "status": "completed"}
              for cid, call in zip(ids, parsed.tool_calls, strict=True)]
    return items


def usage_of(usage: Mapping[str, int]) -> dict[str, Any]:
    return {"input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": usage.get("reasoning_tokens", 0)},
            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}


def response_object(rid: str, created_at: int, model: str, options: Mapping[str, Any], *, status: str,
                    output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                    error: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Response; status in_progress, completed, incomplete (a length stop) or failed (with `error`)."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {"id": rid, "object": "response", "created_at": created_at, "status": status, "error": error,
            "incomplete_details": incomplete, "model": model, "output": output,
            "instructions": None, "tools": [], "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": None,
            "text": {"format": {"type": "text"}}, "max_output_tokens": None, "temperature": None, "top_p": None,
            "metadata": {}, "truncation": "disabled", **options,
            "previous_response_id": None, "store": False, "usage": usage}


def status_of(finish: str) -> str:
    return "incomplete" if finish == "length" else "completed"


def reply(parsed: ParsedOutput, finish: str, *, ids: list[str], usage: Mapping[str, int], model: str,
          options: Mapping[str, Any], rid: str, created_at: int) -> dict[str, Any]:
    """The whole Response of a turn."""
    return response_object(rid, created_at, model, options, status=status_of(finish),
                           output=output_items(parsed, ids, finish), usage=usage_of(usage))
