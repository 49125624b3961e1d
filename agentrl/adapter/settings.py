"""The adapter's settings, what a config sets of it: light to import (a command line builds its flags from them)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .parsers import validate_parsers


class AdapterSettings(BaseModel):
    """What a config sets of the adapter, one default each: a run config's `pool.adapter` (and
    `eval.pool.adapter`), or `agentrl adapter serve`'s flags."""

    model_config = ConfigDict(extra="forbid")

    tool_parser: str | None = "qwen3_coder"
    reasoning_parser: str | None = "qwen3"
    max_context: int = Field(default=32768, gt=0)
    max_new_tokens: int | None = Field(default=4096, gt=0)   # per turn; None: what the context leaves
    model_name: str = "agentrl"          # the model name the agents send
    realign_window: int = Field(default=32, ge=0)
    verify_render_every: int = Field(default=50, ge=0)   # check every Nth incremental render; 0: never
    incremental: bool = True             # False: render and tokenize every chat whole (a baseline, debugging)
    # What one request may be (limits.py); each refusal names its field. Bytes and items bound reading and
    # parsing (orjson holds the GIL); characters and messages bound translating, rendering and tokenizing.
    max_body_bytes: int = Field(default=16 * 2**20, gt=0)
    max_request_chars: int = Field(default=2_000_000, gt=0)   # in the messages' and tools' strings
    max_messages: int = Field(default=10_000, gt=0)
    max_json_depth: int = Field(default=64, gt=0, le=512)    # Python's recursion limit is 1000
    max_json_items: int = Field(default=1_000_000, gt=0)     # commas and brackets in a body: what parsing it costs
    upstream_timeout_s: float = Field(default=600.0, gt=0)
    # While a streamed turn waits for the model, the protocol's keepalive goes out this often (app.py, sse.py), so
    # that a client's read or idle timeout (300 s for Codex, docs/adapter.md) never runs out during a long turn.
    keepalive_s: float = Field(default=5.0, ge=0.01, le=60)
    # An MoE model's routing replay (train.routing_replay): ask the model server for each fed token's experts
    # (SGLang's return_routed_experts; its servers need enable_return_routed_experts) and keep them per token.
    return_routed_experts: bool = False

    @model_validator(mode="after")
    def _known_parsers(self) -> AdapterSettings:
        validate_parsers(self.tool_parser, self.reasoning_parser)
        return self
