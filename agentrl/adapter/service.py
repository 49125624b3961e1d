"""One model turn: chat -> token ids -> /generate -> parsed reply, recorded in the session's tree.

The wire (HTTP, SSE) is app.py's and sse.py's; this is the part every protocol shares. A turn is
two steps, `prepare` (render and tokenize: where a bad request fails) and `complete` (the model
call, recorded), so that a streamed reply can start between them and keep the client waiting
with keepalives while the model works.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from hpc.inference import routing
from hpc.runlayout import RunLayout

from ..sample import ROUTE_DTYPE
from .parsers import THINK_END, ParsedOutput, parse_output
from .render import incremental_problem
from .session import Session, SessionStore, merge_sampling
from .settings import AdapterSettings
from .trajectory import Turn
from .upstream import Generation, UpstreamError, UpstreamPool, registry_servers
from .wire import Chat, WireError, new_tool_ids, reply_message


class AdapterConfig(AdapterSettings):
    """Everything the adapter is told: its settings, the model's tokenizer and where the model is served."""

    tokenizer: Path
    upstreams: list[str] = Field(default_factory=list)     # the model servers' URLs; or, instead,
    registry: Path | None = None         # a run directory: its live inference servers (RUN/services), as they change
    open_unknown_keys: bool = False
    public_url: str | None = None        # advertised base URL (a proxy path included), else http://host:port

    @field_validator("upstreams")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        bad = [u for u in v if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"upstream URLs must start with http:// or https:// (a run's servers: registry): {bad}")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> AdapterConfig:
        if (self.registry is None) == (not self.upstreams):
            raise ValueError("give the model servers' URLs (upstreams) or a run directory (registry), one of the two")
        if self.registry is not None and not RunLayout(self.registry).services_dir.is_dir():
            raise ValueError(f"registry {self.registry}: no services/ directory there: name a run directory")
        return self

    def servers(self) -> list[str] | Callable[[], list[str]]:
        if self.registry is not None:
            from hpc.registry import Registry
            return registry_servers(Registry(RunLayout(self.registry).services_dir))
        return self.upstreams

    @model_validator(mode="after")
    def _tokenizer(self) -> AdapterConfig:
        if not (self.tokenizer / "tokenizer_config.json").is_file():
            raise ValueError(f"{self.tokenizer} holds no tokenizer_config.json: point --tokenizer at a "
                             "Hugging Face model or tokenizer directory")
        return self


@dataclass(frozen=True)
class TurnResult:
    parsed: ParsedOutput
    finish: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int
    recorded: bool               # False when the prompt alone filled the context: nothing was sampled
    call_ids: list[str] = field(default_factory=list)    # one per tool call, fresh
    reasoning_tokens: int = 0    # of the completion tokens

    @property
    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "reasoning_tokens": self.reasoning_tokens}


@dataclass(frozen=True)
class Prepared:
    """A turn rendered and tokenized, not yet sent to the model (`Adapter.prepare`)."""

    session: Session
    chat: Chat
    ids: Any                     # the prompt's ids: a read-only int32 array
    prepare_s: float

    @property
    def prompt_tokens(self) -> int:
        return len(self.ids)


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path))


class Adapter:
    def __init__(self, config: AdapterConfig, tokenizer: Any = None, pool: UpstreamPool | None = None):
        self.config = config
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer)
        if not self.tokenizer.chat_template:
            raise ValueError(f"the tokenizer in {config.tokenizer} has no chat template")
        self.pool = pool or UpstreamPool(config.servers(), timeout_s=config.upstream_timeout_s)
        # Checked once here, on probe conversations; every session's renderer trusts the verdict.
        self.render_problem = incremental_problem(self.render_full) if config.incremental else "off in the config"
        self.sessions = SessionStore(self.tokenizer, self.render_full, render_problem=self.render_problem,
                                     verify_render_every=config.verify_render_every,
                                     incremental_tokens=config.incremental,
                                     realign_window=config.realign_window, open_unknown_keys=config.open_unknown_keys)
        self.stop_ids = sorted({i for i in (self.tokenizer.eos_token_id,
                                            self.tokenizer.convert_tokens_to_ids("<|im_end|>")) if isinstance(i, int)
                                and i != self.tokenizer.unk_token_id})
        self._decoder = getattr(self.tokenizer, "backend_tokenizer", None)
        think_end = self.tokenizer.convert_tokens_to_ids(THINK_END)   # one id in Qwen3's vocabulary and the tiny one
        self._think_end = think_end if isinstance(think_end, int) and think_end != self.tokenizer.unk_token_id else None
        self.overhead_s: deque[float] = deque(maxlen=10_000)   # per turn, upstream excluded (benchmarks)

    def render_full(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=True)

    def render(self, chat: Chat, session: Session | None = None) -> str:
        try:
            if session is None:
                return self.render_full(chat.messages, chat.tools)
            return session.renderer.render(session.echo.restore(chat.messages), chat.tools)
        except Exception as e:   # a template raises for a conversation it cannot render (jinja's own errors)
            raise WireError(f"the chat template cannot render this conversation: {e}") from None

    def decode(self, ids: list[int]) -> str:
        if self._decoder is not None:
            return self._decoder.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def sampling_for(self, session: Session, chat: Chat, prompt_len: int) -> dict[str, Any]:
        params = merge_sampling(session.sampling, chat.sampling)
        room = self.config.max_context - prompt_len
        wanted = [v for v in (params.get("max_new_tokens"), self.config.max_new_tokens) if v]
        params["max_new_tokens"] = min([room, *wanted])
        params["stop_token_ids"] = self.stop_ids
        return params

    def encode(self, text: str) -> list[int]:
        """Ids of a whole text; encode_batch releases the GIL (encode does not)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return self.tokenizer.encode(text, add_special_tokens=False)
        return backend.encode_batch([text], add_special_tokens=False)[0].ids

    def count_tokens(self, chat: Chat) -> int:
        """The rendered prompt's length, outside any session; CPU-bound: call it in a worker thread."""
        return len(self.encode(self.render(chat)))

    def _prepare(self, session: Session, chat: Chat) -> tuple[Any, float]:
        """Render and tokenize (in a worker thread, under the session's lock): the ids and the seconds it took."""
        t0 = time.perf_counter()
        ids = session.tokens.encode_array(self.render(chat, session))
        return ids, time.perf_counter() - t0

    async def prepare(self, session: Session, chat: Chat) -> Prepared:
        """A turn's prompt, rendered and tokenized: what can fail before the model is asked (a WireError)."""
        ids, prepare_s = await in_session_thread(session, self._prepare, session, chat)
        return Prepared(session, chat, ids, prepare_s)

    async def complete(self, turn: Prepared) -> TurnResult:
        """The model's reply to a prepared turn, recorded; UpstreamError when the model server fails."""
        session, chat, ids = turn.session, turn.chat, turn.ids
        t0 = time.perf_counter()
        if len(ids) >= self.config.max_context:
            session.stats["context_full"] += 1
            return TurnResult(ParsedOutput(), "length", len(ids), 0, recorded=False)
        params = self.sampling_for(session, chat, len(ids))
        if session.upstream is None:
            session.upstream = self.pool.pick()
        # From where the turn it will mount under holds none (a concurrent turn of the session may mount it
        # elsewhere meanwhile: then the rows between keep NO_ROUTE, the trainer's own choice).
        routes_from = session.tree.routes_start(ids) if self.config.return_routed_experts else None
        t1 = time.perf_counter()
        try:
            gen = await self.pool.generate(session.upstream, ids, params, routes_from=routes_from)
        except UpstreamError:
            session.stats["upstream_errors"] += 1
            session.stats["upstream_unanswered"] += 1
            session.upstream = None      # the next turn picks again: maybe another server
            raise
        if gen.finish_reason == "abort":
            # SGLang aborts generations when it pauses to load new weights: a retry gets the new ones.
            session.stats["upstream_aborts"] += 1
            session.stats["upstream_unanswered"] += 1
            server, session.upstream = session.upstream, None
            raise UpstreamError(f"{server} aborted the generation (reloading weights?)")
        # The calls that failed since the last answer: an agent that exits while this is not 0 was left
        # without a model; one that was answered since failed or stopped on its own (rollout.attempt)
        session.stats["upstream_unanswered"] = 0
        async with session.lock:     # not while a later turn of this session renders in a thread
            t2 = time.perf_counter()
            out = gen.output_ids
            body = out[:-1] if out and (gen.matched_stop == out[-1] or out[-1] in self.stop_ids) else out
            parsed = parse_output(self.decode(body), tool_parser=self.config.tool_parser,
                                  reasoning_parser=self.config.reasoning_parser, tools=chat.tools)
            finish: Literal["stop", "length"] = "length" if gen.finish_reason == "length" else "stop"
            session.tree.add(Turn(ids, out, gen.logprobs, finish, parsed.ill_formed,
                                  _version(gen.weight_version), meta={"t": time.time()},
                                  **_routes(gen, routes_from, len(ids))))
            session.stats["turns_without_routes"] += routes_from is not None and gen.routed_experts is None
            session.stats["ill_formed_turns"] += parsed.ill_formed
            session.stats["length_stops"] += finish == "length"
            call_ids = new_tool_ids(parsed, chat.call_id_prefix)
            session.echo.remember(reply_message(parsed, call_ids))
        overhead = turn.prepare_s + (t1 - t0) + (time.perf_counter() - t2)
        self.overhead_s.append(overhead)
        session.adapter_s += overhead     # the attempt's record (AttemptMetadata.adapter_s)
        return TurnResult(parsed, finish, len(ids), len(out), recorded=True, call_ids=call_ids,
                          reasoning_tokens=self._reasoning_tokens(parsed, body))

    async def turn(self, session: Session, chat: Chat) -> TurnResult:
        return await self.complete(await self.prepare(session, chat))

    def _reasoning_tokens(self, parsed: ParsedOutput, body: list[int]) -> int:
        """Output tokens through the end of the reasoning (its closing token), or all of them while it is open."""
        if parsed.reasoning is None:
            return 0
        if parsed.truncated_reasoning:
            return len(body)
        return body.index(self._think_end) + 1 if self._think_end is not None and self._think_end in body else 0


# The adapter's CPU work (rendering, tokenizing, parsing large bodies) runs here, off the event loop. Not in
# the loop's default executor: a rollout pool shares that loop, and its ledger I/O on a shared filesystem can
# hold threads for seconds. Tokenizing releases the GIL; rendering and parsing are bounded (limits.py).
CPU = ThreadPoolExecutor(max_workers=8, thread_name_prefix="agentrl-adapter")


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(CPU, fn, *args)


async def in_session_thread(session: Session, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a worker thread, holding the session's lock until fn returns.

    A cancelled caller (its client hung up) cannot stop the thread, so the lock is released by
    the thread's completion, not by the caller: the session's state is never touched by two at once.
    """
    await session.lock.acquire()
    try:
        done = asyncio.get_running_loop().run_in_executor(CPU, fn, *args)
    except BaseException:
        session.lock.release()
        raise

    def release(f: asyncio.Future) -> None:
        session.lock.release()
        if not f.cancelled():
            f.exception()   # retrieved: a caller that went away does not leave it unlogged as "never retrieved"
    done.add_done_callback(release)
    return await asyncio.shield(done)


def _version(v: str | None) -> int | None:
    """The turn's weight version. SGLang calls the weights a server started with "default": agentrl starts
    servers on the run's initial model (version 0) or names the published version it loads
    (hpc.inference.serve), so "default" is version 0. Anything else not a number is unknown (None)."""
    if v == "default":
        return 0
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _routes(gen: Generation, routes_from: int | None, prompt_length: int) -> dict[str, Any]:
    """The Turn's routes from the reply: none when not asked for, or not sent (a server that cannot: those
    positions keep the trainer's own routes, Sample.routed_experts' NO_ROUTE)."""
    if routes_from is None or gen.routed_experts is None:
        return {}
    rows = prompt_length + max(len(gen.output_ids), 1) - 1 - routes_from
    try:
        routes = routing.decode(gen.routed_experts, rows=rows).astype(ROUTE_DTYPE)
    except routing.RoutingError as e:
        raise UpstreamError(f"the model server's routed_experts: {e}") from None
    return {"routes": routes, "routes_start": routes_from}
