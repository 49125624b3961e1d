"""Putting back what a client changed when it echoed our replies.

A client sends each reply back in the next request's history, and the chat is re-rendered
from that echo. Where the echo differs from what was sampled only in form, the re-render
would no longer match the sampled ids: the turn would be REALIGNed or forked and its tokens
trained as prompt. Seen with Qwen Code (docs/agent-clis.md): it trims `reasoning_content`
(`"\\n a \\n"` comes back as `"a"`) and re-serializes tool arguments with JSON.stringify
(`60000.0` comes back as `60000`).

So every reply is remembered by its tool-call ids (unique per reply) or, for a text-only
reply, by its stripped text. An echoed assistant message that matches a remembered reply up to
such form (same ids, names and parsed arguments; reasoning and text equal once stripped) is
replaced by the reply exactly as it was rendered. Anything else is left as the client sent it.
"""

from __future__ import annotations

import json
from typing import Any

Message = dict[str, Any]


def _stripped(value: Any) -> str:
    return (value or "").strip() if isinstance(value, str) else ""


def _calls(message: Message) -> list[tuple[str, str, Any]]:
    return [(c.get("id"), c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]


def same_in_substance(echo: Message, reply: Message) -> bool:
    # Python's == already takes 60000 == 60000.0 and ignores key order, as JSON does.
    return (_calls(echo) == _calls(reply) and _stripped(echo.get("content")) == _stripped(reply.get("content"))
            and _stripped(echo.get("reasoning_content")) == _stripped(reply.get("reasoning_content")))


def _form(message: Message) -> tuple:
    # json.dumps tells 60 from 60.0 and "a" from " a ", which == does not.
    return (message.get("content"), message.get("reasoning_content"),
            json.dumps([args for _id, _name, args in _calls(message)]))


class EchoRestorer:
    """One session's replies, and the last history it restored (so each turn restores only what is new)."""

    def __init__(self) -> None:
        self._replies: dict[Any, Message] = {}
        self._echoed: list[Message] = []
        self._restored: list[Message] = []
        self.restored = 0          # echoes that differed from the reply in form, for metrics

    def remember(self, reply: Message) -> None:
        ids = [c.get("id") for c in reply.get("tool_calls") or []]
        key = ids[0] if ids else ("text", _stripped(reply.get("content")), _stripped(reply.get("reasoning_content")))
        self._replies[key] = reply

    def restore(self, messages: list[Message]) -> list[Message]:
        n = len(self._echoed)
        if n and len(messages) >= n and messages[:n] == self._echoed:     # one C-level comparison
            out = self._restored[:n] + [self._one(m) for m in messages[n:]]
        else:
            out = [self._one(m) for m in messages]
        self._echoed, self._restored = list(messages), out
        return out

    def _one(self, message: Message) -> Message:
        if message.get("role") != "assistant" or not self._replies:
            return message
        calls = message.get("tool_calls") or []
        key = calls[0].get("id") if calls else ("text", _stripped(message.get("content")),
                                                 _stripped(message.get("reasoning_content")))
        reply = self._replies.get(key)
        if reply is None or reply is message or not same_in_substance(message, reply):
            return message
        if _form(reply) != _form(message):
            self.restored += 1
        return reply
