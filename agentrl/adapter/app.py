"""The HTTP service: Anthropic and OpenAI endpoints, SSE streaming, session control routes.

Every error is a JSON body in the caller's API's shape, never a 500 with a traceback: bad
input is 400/413 (limits.py checks a body before any work is done on it), an unknown key 401, a
finished session 409, a failed model server 529 (Anthropic) or 503 (OpenAI), which clients
retry. The shape follows the route: `/v1/messages...` answers Anthropic's
(`{"type": "error", "error": {"type", "message"}}`), every other route, unknown ones and the
control routes included, OpenAI's (`{"error": {"message", "type", "param", "code"}}`).
A client that hangs up aborts its upstream request. Control routes (`/_agentrl/...`) need the
control token, so that an agent, which can reach this service from its sandbox, cannot open,
finish or drop sessions.

The event loop only moves bytes: a large body is parsed in a worker thread, and every turn is
rendered and tokenized in one (service.py), so a large request does not hold up the others.
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
from contextlib import AsyncExitStack
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from . import wire
from .limits import (
    CONTROL_BODY_BYTES,
    LARGE_BODY_BYTES,
    OpenSession,
    RequestError,
    SessionKey,
    check_conversation,
    control_body,
    gc_paused,
    parse_json,
    read_body,
    release_memory,
)
from .service import Adapter, TurnResult, in_thread
from .session import SessionError
from .upstream import UpstreamError
from .wire import Chat, WireError

CONTROL_HEADER = "x-agentrl-control"
_DISCONNECT_POLL_S = 0.25
_INLINE_BODY_BYTES = 64 << 10    # smaller bodies are parsed on the event loop: a thread hop would cost more
_LARGE_AT_ONCE = 2               # large bodies parsed at once: parsing is where a body's memory multiplies


def anthropic_error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


def openai_error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                        status_code=status)


def error_shape(path: str) -> Callable[[int, str, str], JSONResponse]:
    return anthropic_error if path.startswith("/v1/messages") else openai_error


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
    large = asyncio.Semaphore(_LARGE_AT_ONCE)

    def translate(raw: bytes, to_chat: Callable[[Any], Chat]) -> Chat:
        with gc_paused():
            body = parse_json(raw, max_depth=cfg.max_json_depth, max_items=cfg.max_json_items)
            try:
                chat = to_chat(body)
            finally:
                del body     # freed here, in the pause, even when to_chat raises
        check_conversation(chat.messages, chat.tools, max_messages=cfg.max_messages, max_chars=cfg.max_request_chars)
        return chat

    async def chat_of(request: Request, to_chat: Callable[[Any], Chat], cleanup: AsyncExitStack) -> Chat:
        raw = await read_body(request, cfg.max_body_bytes)
        if len(raw) < _INLINE_BODY_BYTES:
            return translate(raw, to_chat)
        if len(raw) >= LARGE_BODY_BYTES:
            # Once the request is answered, give what it freed back to the OS (glibc would keep it).
            cleanup.callback(lambda: asyncio.get_running_loop().run_in_executor(None, release_memory))
            async with large:
                return await in_thread(translate, raw, to_chat)
        return await in_thread(translate, raw, to_chat)

    async def serve_turn(request: Request, to_chat: Callable[[Any], Chat], error: Callable[..., JSONResponse],
                         respond: Callable[[Chat, TurnResult], Response]) -> Response:
        stats["requests"] += 1
        async with AsyncExitStack() as cleanup:
            try:
                session = adapter.sessions.get(_api_key(request))
                chat = await chat_of(request, to_chat, cleanup)
                result = await _unless_disconnected(request, adapter.turn(session, chat))
            except (RequestError, SessionError) as e:
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

    # ------------------------------------------------------------ errors outside the routes

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        stats["errors"] += 1
        path, method = request.url.path, request.method
        if exc.status_code == 404:
            kind, message = "not_found_error", (f"no route {method} {path}: the adapter serves POST /v1/messages, "
                                                "POST /v1/chat/completions and GET /v1/models")
        elif exc.status_code == 405:
            kind, message = "invalid_request_error", (f"{method} is not allowed on {path}; "
                                                      f"use {(exc.headers or {}).get('Allow', 'another method')}")
        else:
            kind, message = "invalid_request_error", str(exc.detail)
        response = error_shape(path)(exc.status_code, kind, message)
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        stats["errors"] += 1
        return error_shape(request.url.path)(400, "invalid_request_error", str(exc))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:   # a bug: logged, and still JSON
        stats["errors"] += 1
        return error_shape(request.url.path)(500, "api_error", f"the adapter failed: {type(exc).__name__}")

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

    def count_chat(body: Any) -> Chat:
        return wire.anthropic_chat({**body, "max_tokens": 1} if isinstance(body, dict) else body)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        async with AsyncExitStack() as cleanup:
            try:
                adapter.sessions.get(_api_key(request))
                chat = await chat_of(request, count_chat, cleanup)
                n = await in_thread(adapter.count_tokens, chat)
            except (RequestError, SessionError) as e:
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

    async def control(request: Request, model: type, act: Callable[[Any], Any]) -> Response:
        token = request.headers.get(CONTROL_HEADER, "")
        if not hmac.compare_digest(token.encode(), control_token.encode()):
            return openai_error(403, "permission_error", f"control routes need the {CONTROL_HEADER} header")
        try:
            raw = await read_body(request, CONTROL_BODY_BYTES, field="the control routes' limit")
            body = parse_json(raw, max_depth=cfg.max_json_depth, max_items=cfg.max_json_items)
            return JSONResponse(act(control_body(model, body)))
        except (RequestError, SessionError) as e:
            return openai_error(e.status, e.kind, str(e))
        except ValueError as e:     # sampling values (session.check_sampling)
            return openai_error(400, "invalid_request_error", str(e))

    def open_session(body: OpenSession) -> dict:
        s = adapter.sessions.open(body.key, sampling=body.sampling, metadata=body.metadata)
        return {"key": s.key, "session_id": s.session_id, "base_url": cfg.public_url}

    @app.post("/_agentrl/open_session")
    async def open_route(request: Request) -> Response:
        return await control(request, OpenSession, open_session)

    @app.post("/_agentrl/finish_session")
    async def finish_route(request: Request) -> Response:
        return await control(request, SessionKey, lambda body: adapter.sessions.finish(body.key).to_json())

    @app.post("/_agentrl/drop_session")
    async def drop_route(request: Request) -> Response:
        return await control(request, SessionKey, lambda body: {"dropped": adapter.sessions.drop(body.key)})

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
