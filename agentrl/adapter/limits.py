"""What one request may be, checked where it comes in, before any work is done on it.

The agents run in hostile sandboxes and can send anything, so a body is bounded and parsed
strictly, and every refusal says what is wrong and what the limit is (the config field named):

- bytes (`max_body_bytes`, 413): a declared Content-Length over the limit is refused before the
  body is read; a body sent without one is counted as it streams and refused once it passes it;
- JSON (400), by orjson, which is RFC 8259: no NaN or Infinity, no number that overflows to
  infinity, no lone UTF-16 surrogate (escaped or as raw bytes), and nesting at most
  `max_json_depth` deep; and, counted before parsing, at most `max_json_items` values (413).
  The cyclic GC is paused meanwhile (`gc_paused`);
- the conversation (413): at most `max_messages` chat messages and `max_request_chars`
  characters in their strings and the tools' (what the chat template renders and the tokenizer
  encodes; an image is a placeholder by then, so its base64 counts only as bytes);
- sampling values (400): their types and SGLang's ranges, from a request body or `open_session`;
- control bodies (400): their fields and types.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hpc.validation import problems

CONTROL_BODY_BYTES = 1 << 20
LARGE_BODY_BYTES = 1 << 20   # after a body this big, freed memory is handed back to the OS
_INT32 = 2**31 - 1


class RequestError(Exception):
    """A refused request; `status` and `kind` go into the API's error shape."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def too_large(message: str) -> RequestError:
    return RequestError(413, "request_too_large", message)


def invalid(message: str) -> RequestError:
    return RequestError(400, "invalid_request_error", message)


async def read_body(request: Any, limit: int, *, field: str = "max_body_bytes") -> bytes:
    """The body's bytes, or 413 as soon as it is known to pass `limit`."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large(f"the body is {int(declared):,} bytes; the limit is {limit:,} ({field})")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            chunks.clear()
            if size >= LARGE_BODY_BYTES:
                asyncio.get_running_loop().run_in_executor(None, release_memory)
            raise too_large(f"the body passed the limit of {limit:,} bytes ({field}) while it was sent")
        chunks.append(chunk)
    return b"".join(chunks)


_gc_lock = threading.Lock()
_gc_pauses = [0, False]      # pauses in progress; whether the GC was enabled when the first began


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC passes meanwhile, in any thread (pauses nest and overlap).

    A body of millions of small arrays parses 5x slower with GC passes, and every pass while it is
    alive walks all of it; each pass, and orjson's parse, holds the GIL from start to end. So a body
    is parsed, checked, translated and freed inside one pause. Nothing it makes is cyclic.
    """
    with _gc_lock:
        if _gc_pauses[0] == 0:
            _gc_pauses[1] = gc.isenabled()
            gc.disable()
        _gc_pauses[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses[0] -= 1
            if _gc_pauses[0] == 0 and _gc_pauses[1]:
                gc.enable()


def parse_json(raw: bytes, *, max_depth: int, max_items: int) -> Any:
    """The body as JSON, strictly; 400 for anything that is not RFC 8259 JSON or nests past max_depth.

    413 before parsing when the body has more than `max_items` commas and opening brackets (in C, about
    1 ms a MiB): a bound on the values it holds, which is what its parse costs in time and memory.
    Strings count too, so it is loose: 2M characters of code hold about 100k.
    """
    items = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    if items > max_items:
        raise too_large(f"the body has {items:,} commas and brackets (strings included): more JSON values than "
                        f"a conversation needs; the limit is {max_items:,} (max_json_items)")
    with gc_paused():
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise invalid(_json_problem(raw, e, max_depth)) from None
        _check_depth(body, max_depth)
    return body


def _depth_problem(max_depth: int) -> str:
    return f"the body nests arrays and objects more than {max_depth} deep; the limit is {max_depth} (max_json_depth)"


def _json_problem(raw: bytes, e: orjson.JSONDecodeError, max_depth: int) -> str:
    msg = str(e)
    if "depth limit" in msg:
        return _depth_problem(max_depth)
    if "surrogate" in msg:
        return f"the body is not valid JSON text: it holds a lone UTF-16 surrogate ({msg})"
    at = raw.decode("utf-8", "replace")[e.pos:e.pos + 9]
    if at.startswith(("NaN", "Infinity", "-Infinity")):
        return f"the body is not valid JSON: NaN and Infinity are not JSON numbers ({msg})"
    return f"the body is not valid JSON: {msg}"


def _check_depth(value: Any, max_depth: int) -> None:
    stack = [(value, 1)] if type(value) in (dict, list) else []
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise invalid(_depth_problem(max_depth))
        for child in node.values() if type(node) is dict else node:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))


def text_chars(value: Any) -> int:
    """Characters in all the strings of a JSON-like value, keys included."""
    total, stack = 0, [value]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is str:
            total += len(node)
        elif kind is dict:
            for k, v in node.items():
                total += len(k) if type(k) is str else 0
                stack.append(v)
        elif kind is list or kind is tuple:
            stack.extend(node)
    return total


def check_conversation(messages: list, tools: list, *, max_messages: int, max_chars: int) -> None:
    """413 unless the chat (as translated, images already placeholders) is within the limits."""
    if len(messages) > max_messages:
        raise too_large(f"the conversation has {len(messages):,} messages; the limit is {max_messages:,} "
                        "(max_messages)")
    chars = text_chars(messages) + text_chars(tools)
    if chars > max_chars:
        raise too_large(f"the conversation holds {chars:,} characters of text; the limit is {max_chars:,} "
                        "(max_request_chars)")


# ---------------------------------------------------------------- sampling values


class Sampling(BaseModel):
    """Sampling values in SGLang's names and ranges (its SamplingParams.verify), plus sane caps."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    temperature: float | None = Field(None, ge=0, le=10)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=_INT32)
    min_p: float | None = Field(None, ge=0, le=1)
    max_new_tokens: int | None = Field(None, gt=0, le=_INT32)
    stop: list[str] | None = Field(None, max_length=64)
    sampling_seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, ge=0, le=2)

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v == 0:
            raise ValueError("must be -1 (all tokens) or at least 1")
        return v


SAMPLING_KEYS = tuple(Sampling.model_fields)


def sampling_values(values: Mapping[str, Any], names: Mapping[str, str] | None = None,
                    prefix: str = "") -> dict[str, Any]:
    """The values, checked; ValueError names each bad one as the caller's wire calls it (`names`)."""
    try:
        return Sampling.model_validate(dict(values)).model_dump(exclude_unset=True)
    except ValidationError as e:
        out = []
        for field, msg in problems(e, unknown_key="is not a sampling key"):
            name = prefix + (names or {}).get(field, field)
            msg = "must be " + msg.removeprefix("Input should be ") if msg.startswith("Input should be ") else msg
            out.append(f"{name} {msg}" if msg.startswith(("must", "is ")) else f"{name}: {msg}")
        raise ValueError("; ".join(out)) from None


# ---------------------------------------------------------------- control bodies

def _key(v: str | None) -> str | None:
    if v is not None and not (v and len(v) <= 256 and all("!" <= ch <= "~" for ch in v)):
        raise ValueError("must be 1 to 256 printable ASCII characters: clients send it as a header")
    return v


class OpenSession(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    key: str | None = None
    sampling: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None

    _check_key = field_validator("key")(_key)


class SessionKey(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    key: str

    _check_key = field_validator("key")(_key)


def control_body(model: type[BaseModel], body: Any) -> Any:
    """The control route's body as `model`, or 400 naming each bad field."""
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise invalid("; ".join(f"{field}: {msg}" if field else msg for field, msg in problems(e))) from None


# ---------------------------------------------------------------- memory

def _malloc_trim() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):   # not glibc: nothing to do
        return None


_trim = _malloc_trim()


def release_memory() -> None:
    """Hand memory freed after a large request back to the OS (glibc keeps it in its heaps otherwise)."""
    if _trim is not None:
        _trim(0)    # ctypes releases the GIL for the call
