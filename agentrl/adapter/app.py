"""The HTTP service: Anthropic and OpenAI endpoints, SSE streaming, session control routes.

Every error is a JSON body in the caller's API's shape, never a 500 with a traceback: bad
input is 400/413, an unknown key 401, a finished session 409, a failed model server 529
(Anthropic) or 503 (OpenAI), which clients retry. A client that hangs up aborts its upstream
request. Control routes (`/_agentrl/...`) need the control token, so that an agent, which
can reach this service from its sandbox, cannot open, finish or drop sessions.

A turn is computed before its response starts, so that its status code can still say
whether it failed; a streaming reply is then sent as SSE events.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from . import wire
from .service import Adapter, TurnResult
from .session import SessionError
from .upstream import UpstreamError
from .wire import Chat, WireError

CONTROL_HEADER = "x-agentrl-control"
_DISCONNECT_POLL_S = 0.25


class _HTTPError(Exception):
    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def anthropic_error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


def openai_error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


async def _json_body(request: Request, limit: int) -> Any:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _HTTPError(413, "request_too_large", f"the body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _HTTPError(413, "request_too_large", f"the body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except ValueError as e:
        raise _HTTPError(400, "invalid_request_error", f"the body is not valid JSON: {e}") from None


def _api_key(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


async def _unless_disconnected(request: Request, work: Awaitable[TurnResult]) -> TurnResult | None:
    """The turn's result, or None after cancelling it if the client hung up meanwhile."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                return None
    finally:
        if not task.done():
            task.cancel()


def _sse(event: str | None, data: Any) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def create_app(adapter: Adapter, control_token: str) -> FastAPI:
    app = FastAPI(title="agentrl adapter", docs_url=None, redoc_url=None, openapi_url=None)
    cfg = adapter.config
    stats = {"requests": 0, "errors": 0, "client_aborts": 0, "started": time.time()}

    async def serve_turn(request: Request, to_chat: Callable[[Any], Chat], error: Callable[..., JSONResponse],
                         respond: Callable[[Chat, TurnResult], Response]) -> Response:
        stats["requests"] += 1
        try:
            session = adapter.sessions.get(_api_key(request))
            chat = to_chat(await _json_body(request, cfg.max_body_bytes))
            result = await _unless_disconnected(request, adapter.turn(session, chat))
        except _HTTPError as e:
            stats["errors"] += 1
            return error(e.status, e.kind, e.message)
        except SessionError as e:
            stats["errors"] += 1
            return error(e.status, e.kind, str(e))
        except WireError as e:
            stats["errors"] += 1
            return error(400, "invalid_request_error", str(e))
        except UpstreamError as e:
            stats["errors"] += 1
            return error(529 if error is anthropic_error else 503,
                         "overloaded_error" if error is anthropic_error else "server_error",
                         f"the model server failed; retry: {e}")
        if result is None:
            stats["client_aborts"] += 1
            return Response(status_code=499)
        return respond(chat, result)

    # ------------------------------------------------------------ Anthropic

    def anthropic_respond(chat: Chat, result: TurnResult) -> Response:
        ids = result.call_ids
        model = chat.model or cfg.model_name
        if not chat.stream:
            return JSONResponse(wire.anthropic_reply(result.parsed, result.finish, model=model, usage=result.usage,
                                                     ids=ids))
        return StreamingResponse(_anthropic_events(result, ids, model), media_type="text/event-stream")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await serve_turn(request, wire.anthropic_chat, anthropic_error, anthropic_respond)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        try:
            adapter.sessions.get(_api_key(request))
            body = await _json_body(request, cfg.max_body_bytes)
            if isinstance(body, dict):
                body = {**body, "max_tokens": 1}
            chat = wire.anthropic_chat(body)
            n = len(adapter.tokenizer.encode(adapter.render(chat), add_special_tokens=False))
        except (_HTTPError, SessionError) as e:
            return anthropic_error(e.status, e.kind, str(e))
        except WireError as e:
            return anthropic_error(400, "invalid_request_error", str(e))
        return JSONResponse({"input_tokens": n})

    # ------------------------------------------------------------ OpenAI

    def openai_respond(chat: Chat, result: TurnResult) -> Response:
        ids = result.call_ids
        model = chat.model or cfg.model_name
        cid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
        finish = wire.openai_finish_reason(result.parsed, result.finish)
        if not chat.stream:
            return JSONResponse({"id": cid, "object": "chat.completion", "created": created, "model": model,
                                 "choices": [{"index": 0, "message": wire.openai_message(result.parsed, ids),
                                              "finish_reason": finish}],
                                 "usage": wire.openai_usage(result.usage)})
        return StreamingResponse(_openai_chunks(result, ids, model, cid, created, finish, chat.include_usage),
                                 media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve_turn(request, wire.openai_chat, openai_error, openai_respond)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": cfg.model_name, "object": "model", "owned_by": "agentrl"}]}

    # ------------------------------------------------------------ health and control

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"ok": True, "sessions": len(adapter.sessions), **stats}

    async def control(request: Request, act: Callable[[dict], Any]) -> Response:
        token = request.headers.get(CONTROL_HEADER, "")
        if not hmac.compare_digest(token.encode(), control_token.encode()):
            return JSONResponse({"error": f"control routes need the {CONTROL_HEADER} header"}, status_code=403)
        try:
            body = await _json_body(request, 1 << 20)
            if not isinstance(body, dict):
                raise _HTTPError(400, "invalid_request_error", "the body must be a JSON object")
            return JSONResponse(act(body))
        except _HTTPError as e:
            return JSONResponse({"error": e.message}, status_code=e.status)
        except SessionError as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        except (ValueError, TypeError) as e:
            return JSONResponse({"error": str(e)}, status_code=400)

    def _key(body: dict) -> str:
        key = body.get("key")
        if not isinstance(key, str) or not key:
            raise ValueError("give the session's key as {\"key\": ...}")
        return key

    def open_session(body: dict) -> dict:
        s = adapter.sessions.open(body.get("key"), sampling=body.get("sampling"), metadata=body.get("metadata"))
        return {"key": s.key, "session_id": s.session_id, "base_url": cfg.public_url}

    @app.post("/_agentrl/open_session")
    async def open_route(request: Request) -> Response:
        return await control(request, open_session)

    @app.post("/_agentrl/finish_session")
    async def finish_route(request: Request) -> Response:
        return await control(request, lambda body: adapter.sessions.finish(_key(body)))

    @app.post("/_agentrl/drop_session")
    async def drop_route(request: Request) -> Response:
        return await control(request, lambda body: {"dropped": adapter.sessions.drop(_key(body))})

    return app


async def _anthropic_events(result: TurnResult, ids: list[str], model: str) -> AsyncIterator[str]:
    message = wire.anthropic_reply(result.parsed, result.finish, model=model, usage=result.usage, ids=ids)
    blocks, usage = message.pop("content"), message.pop("usage")
    stop_reason = message.pop("stop_reason")
    yield _sse("message_start", {"type": "message_start",
                                 "message": {**message, "content": [], "stop_reason": None,
                                             "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 0}}})
    for i, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            yield _sse("content_block_start", {"type": "content_block_start", "index": i,
                                               "content_block": {"type": "text", "text": ""}})
            delta = {"type": "text_delta", "text": block["text"]}
        elif kind == "thinking":
            yield _sse("content_block_start", {"type": "content_block_start", "index": i,
                                               "content_block": {"type": "thinking", "thinking": ""}})
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                               "delta": {"type": "thinking_delta", "thinking": block["thinking"]}})
            delta = {"type": "signature_delta", "signature": block["signature"]}
        else:
            yield _sse("content_block_start", {"type": "content_block_start", "index": i,
                                               "content_block": {**block, "input": {}}})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        yield _sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": i})
    yield _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                                 "usage": {"output_tokens": usage["output_tokens"]}})
    yield _sse("message_stop", {"type": "message_stop"})


async def _openai_chunks(result: TurnResult, ids: list[str], model: str, cid: str, created: int, finish: str,
                         include_usage: bool) -> AsyncIterator[str]:
    def chunk(delta: dict, finish_reason: str | None = None, **extra) -> str:
        return _sse(None, {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra})
    msg = wire.openai_message(result.parsed, ids)
    yield chunk({"role": "assistant", "content": ""})
    if msg.get("reasoning_content"):
        yield chunk({"reasoning_content": msg["reasoning_content"]})
    if msg.get("content"):
        yield chunk({"content": msg["content"]})
    for i, call in enumerate(msg.get("tool_calls", [])):
        yield chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": ""}}]})
        yield chunk({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
    yield chunk({}, finish)
    if include_usage:
        yield _sse(None, {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                          "choices": [], "usage": wire.openai_usage(result.usage)})
    yield "data: [DONE]\n\n"
