"""Streamed replies (SSE) of the three APIs, and the keepalives that hold a long turn open.

A streamed turn starts as soon as its prompt is rendered and tokenized (`service.Adapter.prepare`):
the stream opens with what the API sends before any output (Anthropic's `message_start`, the OpenAI
chat API's first chunk with the role, the Responses API's `response.created` and
`response.in_progress`), sends the API's keepalive every `keepalive_s` while the model works, then
the reply's events. The keepalives:

- Anthropic: `event: ping`, as Anthropic's API sends;
- OpenAI chat: an SSE comment line `: keepalive`, which SSE parsers skip but a read timeout counts;
- Responses: `{"type": "keepalive", "sequence_number": n}` events, as OpenAI's API sends on long turns.
  Not comments: Codex gives up after `stream_idle_timeout_ms` (300 s) without an SSE *event*, and its
  parser (the eventsource-stream crate) drops comment lines before its timer sees them. Codex ignores
  event types it does not know; the OpenAI Python SDK passes them through.

A failure once a stream has started (the model server's, or a bug) can no longer change the status
code, so the stream reports it in the API's error shape and ends: Anthropic `event: error`, an
OpenAI error object (what the OpenAI SDKs raise on), Responses `response.failed` (Codex retries it).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from typing import Any

from . import wire, wire_gemini, wire_responses
from .service import TurnResult
from .upstream import UpstreamError


def sse(event: str | None, data: Any) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


class Events:
    """One streamed reply in one API's events."""

    def opening(self) -> list[str]:
        """What goes out at once, before the model has answered."""
        raise NotImplementedError

    def keepalive(self) -> str:
        raise NotImplementedError

    def reply(self, result: TurnResult) -> Iterator[str]:
        raise NotImplementedError

    def failure(self, message: str, *, retryable: bool) -> list[str]:
        """The end of a stream whose turn failed: retryable for the model server's failures."""
        raise NotImplementedError


async def keepalive_stream(events: Events, work: Callable[[], Awaitable[TurnResult]], keepalive_s: float,
                           stats: MutableMapping[str, Any]) -> AsyncIterator[str]:
    """The opening, keepalives every keepalive_s until `work()` is done, then its reply or its failure.

    A client that hangs up cancels the stream (Starlette), and with it the turn: not recorded.
    """
    for chunk in events.opening():
        yield chunk
    task = asyncio.ensure_future(work())
    task.add_done_callback(lambda t: t.cancelled() or t.exception())   # retrieved, whoever is still listening
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=keepalive_s)
            if done:
                break
            yield events.keepalive()
        try:
            result = task.result()
        except UpstreamError as e:
            stats["errors"] += 1
            ending = events.failure(f"the model server failed; retry: {e}", retryable=True)
        except Exception as e:    # a bug: still the API's shape, never a cut stream
            stats["errors"] += 1
            ending = events.failure(f"the adapter failed: {type(e).__name__}", retryable=False)
        else:
            ending = list(events.reply(result))
        for chunk in ending:
            yield chunk
    finally:
        if not task.done():
            task.cancel()
            stats["client_aborts"] += 1


class AnthropicEvents(Events):
    def __init__(self, model: str, input_tokens: int):
        self.model, self.input_tokens = model, input_tokens
        self.id = "msg_" + secrets.token_hex(12)

    def opening(self) -> list[str]:
        return [sse("message_start", {"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}})]

    def keepalive(self) -> str:
        return sse("ping", {"type": "ping"})

    def reply(self, result: TurnResult) -> Iterator[str]:
        for i, block in enumerate(wire.anthropic_blocks(result.parsed, result.call_ids)):
            kind = block["type"]
            start: dict[str, Any]
            delta: dict[str, Any]
            if kind == "text":
                start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
            elif kind == "thinking":
                start, delta = {"type": "thinking", "thinking": ""}, {"type": "signature_delta",
                                                                      "signature": block["signature"]}
            else:
                start = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
            yield sse("content_block_start", {"type": "content_block_start", "index": i, "content_block": start})
            if kind == "thinking":
                yield sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                  "delta": {"type": "thinking_delta", "thinking": block["thinking"]}})
            yield sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
            yield sse("content_block_stop", {"type": "content_block_stop", "index": i})
        yield sse("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": wire.anthropic_stop_reason(result.parsed, result.finish),
                                              "stop_sequence": None},
                                    "usage": {"output_tokens": result.completion_tokens}})
        yield sse("message_stop", {"type": "message_stop"})

    def failure(self, message: str, *, retryable: bool) -> list[str]:
        kind = "overloaded_error" if retryable else "api_error"
        return [sse("error", {"type": "error", "error": {"type": kind, "message": message}})]


class ChatChunks(Events):
    def __init__(self, model: str, include_usage: bool):
        self.model, self.include_usage = model, include_usage
        self.id, self.created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return sse(None, {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                          "model": self.model, "choices": [choice]})

    def opening(self) -> list[str]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def keepalive(self) -> str:
        return ": keepalive\n\n"

    def reply(self, result: TurnResult) -> Iterator[str]:
        msg = wire.openai_message(result.parsed, result.call_ids)
        if msg.get("reasoning_content"):
            yield self._chunk({"reasoning_content": msg["reasoning_content"]})
        if msg.get("content"):
            yield self._chunk({"content": msg["content"]})
        for i, call in enumerate(msg.get("tool_calls", [])):
            yield self._chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                               "function": {"name": call["function"]["name"], "arguments": ""}}]})
            yield self._chunk({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
        yield self._chunk({}, wire.openai_finish_reason(result.parsed, result.finish))
        if self.include_usage:
            yield sse(None, {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                             "model": self.model, "choices": [], "usage": wire.openai_usage(result.usage)})
        yield "data: [DONE]\n\n"

    def failure(self, message: str, *, retryable: bool) -> list[str]:
        return [sse(None, {"error": {"message": message, "type": "server_error", "param": None, "code": None}})]


class ResponsesEvents(Events):
    """The Responses API's events, each with its sequence_number (keepalives count too, as OpenAI's do)."""

    def __init__(self, model: str, options: dict[str, Any]):
        self.model, self.options = model, options
        self.id, self.created = wire_responses.new_id("resp_"), int(time.time())
        self.sequence = 0

    def _event(self, kind: str, **data: Any) -> str:
        self.sequence += 1
        return sse(kind, {"type": kind, "sequence_number": self.sequence - 1, **data})

    def response(self, **fields: Any) -> dict[str, Any]:
        return wire_responses.response_object(self.id, self.created, self.model, self.options, **fields)

    def opening(self) -> list[str]:
        shell = self.response(status="in_progress", output=[])
        return [self._event("response.created", response=shell), self._event("response.in_progress", response=shell)]

    def keepalive(self) -> str:
        return self._event("keepalive")

    def reply(self, result: TurnResult) -> Iterator[str]:
        items = wire_responses.output_items(result.parsed, result.call_ids, result.finish)
        for i, item in enumerate(items):
            yield from self._item(i, item)
        status = wire_responses.status_of(result.finish)
        final = self.response(status=status, output=items, usage=wire_responses.usage_of(result.usage))
        yield self._event("response.completed" if status == "completed" else "response.incomplete", response=final)

    def _item(self, i: int, item: dict[str, Any]) -> Iterator[str]:
        at = {"item_id": item["id"], "output_index": i}
        kind = item["type"]
        if kind == "reasoning":
            part = item["content"][0]
            yield self._event("response.output_item.added", output_index=i, item={
                **item, "content": [], "encrypted_content": None, "status": "in_progress"})
            yield self._event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
            yield self._event("response.reasoning_text.delta", **at, content_index=0, delta=part["text"])
            yield self._event("response.reasoning_text.done", **at, content_index=0, text=part["text"])
            yield self._event("response.content_part.done", **at, content_index=0, part=part)
        elif kind == "message":
            part = item["content"][0]
            yield self._event("response.output_item.added", output_index=i, item={
                **item, "content": [], "status": "in_progress"})
            yield self._event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
            if part["text"]:
                yield self._event("response.output_text.delta", **at, content_index=0, delta=part["text"],
                                  logprobs=[])
            yield self._event("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[])
            yield self._event("response.content_part.done", **at, content_index=0, part=part)
        else:
            yield self._event("response.output_item.added", output_index=i, item={
                **item, "arguments": "", "status": "in_progress"})
            yield self._event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield self._event("response.function_call_arguments.done", **at, arguments=item["arguments"])
        yield self._event("response.output_item.done", output_index=i, item=item)

    def failure(self, message: str, *, retryable: bool) -> list[str]:
        return [self._event("response.failed", response=self.response(
            status="failed", output=[], error={"code": "server_error", "message": message}))]


class GeminiEvents(Events):
    """Gemini's streamed GenerateContentResponses (`alt=sse`): the whole reply as one event. A keepalive is a
    response without candidates: the Google GenAI SDK's reader takes only `data:` lines (after an SSE
    comment it matched nothing more, and Gemini CLI retried the turn as an empty stream), and Gemini CLI
    skips a chunk without candidates."""

    def __init__(self, model: str):
        self.model, self.id = model, uuid.uuid4().hex

    def opening(self) -> list[str]:
        return []

    def keepalive(self) -> str:
        return sse(None, {"candidates": []})

    def reply(self, result: TurnResult) -> Iterator[str]:
        yield sse(None, wire_gemini.reply(result.parsed, result.finish, ids=result.call_ids, usage=result.usage,
                                          model=self.model, rid=self.id))

    def failure(self, message: str, *, retryable: bool) -> list[str]:
        return [sse(None, wire_gemini.error_body(503 if retryable else 500, message))]
