"""The HTTP service: Anthropic Messages, OpenAI chat and Responses endpoints, SSE streaming, control routes.

Every error is a JSON body in the caller's API's shape, never a 500 with a traceback: bad
input is 400/413 (limits.py checks a body before any work is done on it), an unknown key 401, a
finished session 409, a failed model server 529 (Anthropic) or 503 (OpenAI), which clients
retry. The shape follows the route: `/v1/messages` and `/v1/messages/...` answer Anthropic's
(`{"type": "error", "error": {"type", "message"}}`), every other route, `/v1/responses`, unknown
routes and methods and the control routes included, OpenAI's (`{"error": {"message", "type",
"param", "code"}}`). A client that hangs up aborts its upstream request. Control routes
(`/_agentrl/...`) need the control token, so that an agent, which can reach this service from its
sandbox, cannot open, finish or drop sessions.

The event loop only moves bytes: a large body is parsed in a worker thread, and every turn is
rendered and tokenized in one (service.py), so a large request does not hold up the others.
A non-streaming turn is computed before its response starts, so that its status code can say
whether it failed. A streaming one starts its response once its prompt is rendered and tokenized
(a bad request still gets its status code) and sends the API's keepalives while the model works
(sse.py): a turn longer than a client's read or idle timeout still completes.
"""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from . import wire, wire_gemini, wire_responses
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
from .service import Adapter, Prepared, TurnResult, in_thread
from .session import SessionError
from .sse import AnthropicEvents, ChatChunks, Events, GeminiEvents, ResponsesEvents, keepalive_stream
from .upstream import UpstreamError
from .wire import Chat, WireError

CONTROL_HEADER = "x-agentrl-control"
_DISCONNECT_POLL_S = 0.25
_INLINE_BODY_BYTES = 64 << 10    # smaller bodies are parsed on the event loop: a thread hop would cost more
_LARGE_AT_ONCE = 2               # large bodies parsed at once: parsing is where a body's memory multiplies


T = TypeVar("T")
_STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}   # no proxy may hold the keepalives


def anthropic_error(status: int, kind: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


def openai_error(status: int, kind: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status)


def gemini_error(status: int, kind: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(wire_gemini.error_body(status, message), status_code=status)


def error_shape(path: str) -> Callable[..., JSONResponse]:
    if path.startswith("/v1beta/"):
        return gemini_error
    return anthropic_error if path == "/v1/messages" or path.startswith("/v1/messages/") else openai_error


def _api_key(request: Request) -> str | None:
    key = request.headers.get("x-api-key") or request.headers.get("x-goog-api-key")   # Anthropic's, Gemini's
    if key:
        return key
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """The work's result, or None after cancelling it if the client hung up meanwhile."""
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


def create_app(adapter: Adapter, control_token: str) -> FastAPI:
    # No redirect to the slash-less route (a 307 to a URL a proxy may not serve): a 404 in the API's shape.
    app = FastAPI(title="agentrl adapter", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
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
                         respond: Callable[[Chat, TurnResult], Response],
                         stream: Callable[[Chat, Prepared], Events]) -> Response:
        stats["requests"] += 1
        async with AsyncExitStack() as cleanup:
            try:
                session = adapter.sessions.get(_api_key(request))
                chat = await chat_of(request, to_chat, cleanup)
                prepared: Prepared | None = None
                result: TurnResult | None = None
                if chat.stream:
                    prepared = await _unless_disconnected(request, adapter.prepare(session, chat))
                else:
                    result = await _unless_disconnected(request, adapter.turn(session, chat))
            except (RequestError, SessionError) as e:
                stats["errors"] += 1
                return error(e.status, e.kind, str(e))
            except WireError as e:
                stats["errors"] += 1
                return error(400, "invalid_request_error", str(e), e.param)
            except UpstreamError as e:
                stats["errors"] += 1
                return error(529 if error is anthropic_error else 503,
                             "overloaded_error" if error is anthropic_error else "server_error",
                             f"the model server failed; retry: {e}")
            if prepared is not None:
                turn = prepared
                return StreamingResponse(keepalive_stream(stream(chat, turn), lambda: adapter.complete(turn),
                                                          cfg.keepalive_s, stats),
                                         media_type="text/event-stream", headers=_STREAM_HEADERS)
            if result is not None:
                return respond(chat, result)
            stats["client_aborts"] += 1
            return Response(status_code=499)

    def model_of(chat: Chat) -> str:
        return chat.model or cfg.model_name

    # ------------------------------------------------------------ errors outside the routes

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        stats["errors"] += 1
        path, method = request.url.path, request.method
        if exc.status_code == 404:
            kind, message = "not_found_error", (f"no route {method} {path}: the adapter serves POST /v1/messages, "
                                                "POST /v1/chat/completions, POST /v1/responses, "
                                                "POST /v1beta/models/MODEL:generateContent and GET /v1/models")
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
        return JSONResponse(wire.anthropic_reply(result.parsed, result.finish, model=model_of(chat),
                                                 usage=result.usage, ids=result.call_ids))

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await serve_turn(request, wire.anthropic_chat, anthropic_error, anthropic_respond,
                                lambda chat, turn: AnthropicEvents(model_of(chat), turn.prompt_tokens))

    def count_chat(body: Any) -> Chat:
        return wire.anthropic_chat({**body, "max_tokens": 1} if isinstance(body, dict) else body)

    async def count_route(request: Request, to_chat: Callable[[Any], Chat], error: Callable[..., JSONResponse],
                          reply: Callable[[int], dict]) -> Response:
        """The rendered prompt's token count, for a session's key, in the API's reply and error shapes."""
        async with AsyncExitStack() as cleanup:
            try:
                adapter.sessions.get(_api_key(request))
                chat = await chat_of(request, to_chat, cleanup)
                n = await in_thread(adapter.count_tokens, chat)
            except (RequestError, SessionError) as e:
                return error(e.status, e.kind, str(e))
            except WireError as e:
                return error(400, "invalid_request_error", str(e))
            return JSONResponse(reply(n))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        return await count_route(request, count_chat, anthropic_error, lambda n: {"input_tokens": n})

    # ------------------------------------------------------------ OpenAI

    def openai_respond(chat: Chat, result: TurnResult) -> Response:
        return JSONResponse({"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion",
                             "created": int(time.time()), "model": model_of(chat),
                             "choices": [{"index": 0, "message": wire.openai_message(result.parsed, result.call_ids),
                                          "finish_reason": wire.openai_finish_reason(result.parsed, result.finish)}],
                             "usage": wire.openai_usage(result.usage)})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve_turn(request, wire.openai_chat, openai_error, openai_respond,
                                lambda chat, turn: ChatChunks(model_of(chat), chat.include_usage))

    def responses_respond(chat: Chat, result: TurnResult) -> Response:
        return JSONResponse(wire_responses.reply(result.parsed, result.finish, ids=result.call_ids, usage=result.usage,
                                                 model=model_of(chat), options=chat.options,
                                                 rid=wire_responses.new_id("resp_"), created_at=int(time.time())))

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await serve_turn(request, wire_responses.responses_chat, openai_error, responses_respond,
                                lambda chat, turn: ResponsesEvents(model_of(chat), chat.options))

    # ------------------------------------------------------------ Gemini

    def gemini_respond(chat: Chat, result: TurnResult) -> Response:
        return JSONResponse(wire_gemini.reply(result.parsed, result.finish, ids=result.call_ids, usage=result.usage,
                                              model=model_of(chat), rid=uuid.uuid4().hex))

    @app.post("/v1beta/models/{target}")
    async def gemini(request: Request, target: str) -> Response:
        try:
            model, method = wire_gemini.split_target(target)
        except wire_gemini.UnknownMethod as e:
            return gemini_error(404, "not_found_error", str(e))
        stream = method == "streamGenerateContent"
        if stream and request.query_params.get("alt") != "sse":
            return gemini_error(400, "invalid_request_error",
                                "streamGenerateContent is served as server-sent events only: add ?alt=sse")

        def to_chat(body: Any) -> Chat:
            return wire_gemini.gemini_chat(body, model=model, stream=stream)
        if method == "countTokens":     # its body is a GenerateContentRequest, or one under generateContentRequest
            return await count_route(request, lambda body: to_chat(
                body.get("generateContentRequest", body) if isinstance(body, dict) else body), gemini_error,
                lambda n: {"totalTokens": n})
        return await serve_turn(request, to_chat, gemini_error, gemini_respond,
                                lambda chat, turn: GeminiEvents(model_of(chat)))

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
