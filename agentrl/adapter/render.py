"""Rendering a session's chats with the model's template, re-rendering only what is new.

A CLI re-sends the whole conversation every turn; rendering it whole costs O(history) (about
55 ms at 96k tokens with transformers' renderer). The usual request is the previous one plus
the model's reply and what came back (tool results, a user message). Then

    text = previous text + tail,   tail = render(anchor + new) - render(anchor)

where the anchor is an empty user turn and both are rendered without tools (a tools block can
be thousands of tokens). That is exact when the template renders each message independently
of the messages before it and of the tools. ChatML templates do; Qwen3's
own does not (it drops reasoning from turns before the last user message). So the template
is checked on probe conversations when a `ChatRenderer` is made: any mismatch, or a template
that raises on the probes, means every chat is rendered whole. With `verify_every=N` every
Nth incremental render is also checked against a full render, and a mismatch switches that
session to full renders for good.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Render = Callable[[list[dict[str, Any]], list[dict[str, Any]]], str]   # (messages, tools) -> text + gen prompt

_ANCHOR_USER = {"role": "user", "content": ""}


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": f"probe-{name}", "type": "function", "function": {"name": name, "arguments": arguments}}


_PROBE_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "shell", "description": "Run a command",
                                      "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]
_PROBE: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a probe."},
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": "A first answer.", "reasoning_content": "first thoughts"},
    {"role": "user", "content": "now use a tool"},
    {"role": "assistant", "content": "", "reasoning_content": "tool time", "tool_calls": [_call("shell", cmd="ls")]},
    {"role": "tool", "tool_call_id": "probe-shell", "content": "a.txt"},
    {"role": "assistant", "content": "Two at once.",
     "tool_calls": [_call("shell", cmd="cat a.txt"), _call("shell", cmd="wc -l a.txt")]},
    {"role": "tool", "tool_call_id": "probe-shell", "content": "hello"},
    {"role": "tool", "tool_call_id": "probe-shell", "content": "1 a.txt"},
    {"role": "user", "content": "and finally"},
    {"role": "assistant", "content": "Done.", "reasoning_content": "last thoughts"},
    {"role": "user", "content": "thanks"},
]


def _probes() -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    return [(_PROBE, _PROBE_TOOLS), (_PROBE, []), (_PROBE[1:], _PROBE_TOOLS), (_PROBE[1:], [])]


def incremental_problem(render: Render) -> str | None:
    """Why rendering only the tail would differ from a full render with this template; None if it does not."""
    for messages, tools in _probes():
        ends = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        try:
            for cut in ends:
                # The request before the reply at `cut`, then every later request built on it.
                renderer = ChatRenderer(render, check=False)
                renderer.render(messages[:cut], tools)
                for end in [e for e in range(cut + 1, len(messages) + 1) if e == len(messages)
                            or messages[e]["role"] == "assistant"]:
                    got, want = renderer.render(messages[:end], tools), render(messages[:end], tools)
                    if got != want:
                        return f"rendering only the new messages differs from a full render (probe of {end} messages)"
        except Exception as e:   # a template may refuse the probes' shapes (strict role alternation)
            return f"the template cannot render the probe conversation: {e}"
    return None


class ChatRenderer:
    """One session's renderer. `render(messages, tools)` equals `render_fn(messages, tools)`."""

    def __init__(self, render: Render, *, check: bool = True, problem: str | None = None, verify_every: int = 0):
        self._render = render
        self.problem = incremental_problem(render) if check else problem
        self.verify_every = verify_every
        self.incremental = self.full = self.mismatches = 0
        self._messages: list[dict[str, Any]] = []
        self._tools: list[dict[str, Any]] | None = None
        self._text = ""
        self._head: str | None = None

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> str:
        messages, tools = list(messages), list(tools)
        text = None if self.problem else self._tail(messages, tools)
        if text is None:
            self.full += 1
            text = self._render(messages, tools)
        else:
            self.incremental += 1
            if self.verify_every and self.incremental % self.verify_every == 0:
                whole = self._render(messages, tools)
                if whole != text:
                    self.mismatches += 1
                    self.problem = "an incremental render differed from the full one"
                    text = whole
        self._messages, self._tools, self._text = messages, tools, text
        return text

    def _tail(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str | None:
        n = len(self._messages)
        if not n or len(messages) <= n or messages[n].get("role") != "assistant" or tools != self._tools:
            return None
        if messages[:n] != self._messages:        # one C-level comparison of the history
            return None
        if self._head is None:
            self._head = self._render([_ANCHOR_USER], [])
        whole = self._render([_ANCHOR_USER, *messages[n:]], [])
        if not whole.startswith(self._head):
            return None
        return self._text + whole[len(self._head):]
