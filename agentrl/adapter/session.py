"""Sessions: one per rollout attempt, named by the API key its CLI sends.

A session holds the attempt's sampling values, its model server, its tokenized prefix and its
trajectory tree. A finished session keeps a tombstone, so a late request from its CLI gets
409 rather than opening a new session by accident.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .echo import EchoRestorer
from .limits import SAMPLING_KEYS, sampling_values
from .render import ChatRenderer, Render
from .tokens import PrefixTokenizer
from .trajectory import Chain, Drift, TrajectoryTree


class SessionError(Exception):
    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind = status, kind


def merge_sampling(session: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling values of one turn.

    Values given when the session was opened outrank the request body: a CLI that sends
    temperature=1 on every call must not override the run's eval temperature. The body
    fills only the keys the session left unset.
    """
    return {**body, **session}


def check_sampling(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """A session's sampling values, checked (`limits.Sampling`); ValueError says which are wrong."""
    unknown = set(sampling) - set(SAMPLING_KEYS)
    if unknown:
        raise ValueError(f"unknown sampling keys {sorted(unknown)}: use {', '.join(SAMPLING_KEYS)}")
    return sampling_values(sampling, prefix="sampling.")


@dataclass
class Session:
    key: str
    session_id: str
    sampling: dict[str, Any]
    metadata: dict[str, Any]
    tree: TrajectoryTree
    renderer: ChatRenderer
    tokens: PrefixTokenizer
    upstream: str | None = None
    opened: float = field(default_factory=time.time)
    stats: Counter = field(default_factory=Counter)
    adapter_s: float = 0.0       # the adapter's own time over the session's turns, the model's excluded
    echo: EchoRestorer = field(default_factory=EchoRestorer)
    finished: bool = False
    # Held while a turn renders and tokenizes in a worker thread, and while a turn is recorded: one at a time.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def result(self) -> FinishedSession:
        """What a finished session hands to the rollout worker."""
        chains = self.tree.samples()
        counts = {d.value: n for d, n in self.tree.counts.items()}
        return FinishedSession(
            self.session_id, self.metadata, chains,
            {**self.stats, "turns": self.tree.turns, "chains": self.tree.chains, "branches": self.tree.branches,
             "drift": counts, "dropped_chains": self.tree.chains - len(chains),
             "prefix_hits": self.tokens.hits, "prefix_fallbacks": self.tokens.fallbacks,
             "incremental_renders": self.renderer.incremental, "full_renders": self.renderer.full,
             "render_mismatches": self.renderer.mismatches, "echoes_restored": self.echo.restored,
             "adapter_s": self.adapter_s})


@dataclass(frozen=True)
class FinishedSession:
    """A finished session: its chains that train (one sample each, `Chain.to_sample`) and its counts."""

    session_id: str
    metadata: dict[str, Any]         # what the session was opened with: the caller's own
    chains: list[Chain]
    stats: dict[str, Any]            # the session's counters, and the tree's: turns, chains, branches, drift, ...

    def to_json(self) -> dict[str, Any]:
        """The finish_session route's reply."""
        return {"session_id": self.session_id, "metadata": self.metadata,
                "samples": [chain.to_json() for chain in self.chains], "stats": self.stats}


class SessionStore:
    def __init__(self, tokenizer: Any, render: Render, *, render_problem: str | None = None,
                 verify_render_every: int = 0, incremental_tokens: bool = True, realign_window: int = 32,
                 open_unknown_keys: bool = False):
        self._tokenizer = tokenizer
        self._incremental_tokens = incremental_tokens
        self._verify_every = verify_render_every
        self._render, self._render_problem = render, render_problem
        self._realign_window = realign_window
        self.open_unknown_keys = open_unknown_keys
        self._sessions: dict[str, Session] = {}
        self._tombstones: dict[str, str] = {}    # key -> session_id of finished or dropped sessions

    def open(self, key: str | None = None, *, sampling: Mapping[str, Any] | None = None,
             metadata: Mapping[str, Any] | None = None) -> Session:
        key = key or "sk-agentrl-" + secrets.token_urlsafe(32)
        if key in self._sessions or key in self._tombstones:
            raise SessionError(409, "invalid_request_error", "this key already named a session: use a fresh key")
        session = Session(key, "s-" + secrets.token_hex(8), check_sampling(sampling or {}), dict(metadata or {}),
                          TrajectoryTree(self._realign_window),
                          ChatRenderer(self._render, check=False, problem=self._render_problem,
                                       verify_every=self._verify_every),
                          PrefixTokenizer(self._tokenizer, incremental=self._incremental_tokens))
        self._sessions[key] = session
        return session

    def get(self, key: str | None) -> Session:
        if not key:
            raise SessionError(401, "authentication_error", "no API key: send the session key as x-api-key or "
                                                            "Authorization: Bearer")
        session = self._sessions.get(key)
        if session is not None:
            return session
        if key in self._tombstones:
            raise SessionError(409, "invalid_request_error",
                               f"session {self._tombstones[key]} is finished: its rollout is over")
        if self.open_unknown_keys:
            return self.open(key)
        raise SessionError(401, "authentication_error", "unknown API key: no open session has it")

    def finish(self, key: str) -> FinishedSession:
        session = self._take(key)
        session.finished = True
        return session.result()

    def drop(self, key: str) -> bool:
        try:
            self._take(key)
        except SessionError:
            return False
        return True

    def _take(self, key: str) -> Session:
        session = self._sessions.pop(key, None)
        if session is None:
            raise SessionError(409 if key in self._tombstones else 404, "not_found_error",
                               "no open session has this key")
        self._tombstones[key] = session.session_id
        return session

    def __len__(self) -> int:
        return len(self._sessions)

    def drift_totals(self) -> dict[str, int]:
        total: Counter = Counter()
        for s in self._sessions.values():
            total.update({d.value: n for d, n in s.tree.counts.items() if d is not Drift.ROOT})
        return dict(total)
