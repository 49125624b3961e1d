"""SGLang `/generate` servers: one call with token ids, and the choice of server per session.

A session sticks to one server so that its prefix stays in that server's radix cache; with a
run's service registry, a server whose heartbeat is stale is not picked. A server
that fails mid-request raises `UpstreamError`: the client gets a retryable error and the
turn is not recorded. `wait_healthy` holds work back while no server answers `GET /health` (one
killed and restarting, SGLang still warming up), so that an outage does not spend it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import orjson

from hpc.registry import Registry

log = logging.getLogger("agentrl.adapter")
HEALTH_TIMEOUT_S = 30.0     # one probe: an idle SGLang generates a token to answer /health, and gives up at 20 s


class UpstreamError(RuntimeError):
    """The model server failed or is unreachable: retryable, never a sample."""


@dataclass(frozen=True)
class Generation:
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str            # "stop" | "length" | "abort"
    matched_stop: int | None      # the stop token id that ended it, if any
    weight_version: str | None
    routed_experts: str | None = None    # an MoE's routes, SGLang's wire form (hpc.inference.routing.decode)


def sglang_payload(input_ids: Sequence[int], sampling: dict[str, Any], *,
                   routes_from: int | None = None) -> dict[str, Any]:
    """The /generate body; with `routes_from`, the routed experts of positions [routes_from, seqlen - 1) too."""
    ids = input_ids if isinstance(input_ids, np.ndarray) else list(input_ids)
    body = {"input_ids": ids, "sampling_params": sampling, "return_logprob": True,
            "logprob_start_len": -1, "stream": False}
    if routes_from is not None:
        body.update(return_routed_experts=True, routed_experts_start_len=routes_from)
    return body


def parse_generation(reply: Any) -> Generation:
    """SGLang's reply: ids and logprobs from meta_info.output_token_logprobs ([logprob, id, text])."""
    try:
        meta = reply["meta_info"]
        pairs = meta["output_token_logprobs"]
        ids = [int(p[1]) for p in pairs]
        logprobs = [float(p[0]) if p[0] is not None else 0.0 for p in pairs]
        out_ids = reply.get("output_ids")
        if out_ids is not None and list(out_ids) != ids:
            raise UpstreamError(f"output_ids and output_token_logprobs disagree ({len(out_ids)} vs {len(ids)} tokens)")
        fin = meta.get("finish_reason") or {}
        kind = fin.get("type", "stop") if isinstance(fin, dict) else str(fin)
        matched = fin.get("matched") if isinstance(fin, dict) and isinstance(fin.get("matched"), int) else None
        version = meta.get("weight_version")
        routes = meta.get("routed_experts")
        if routes is not None and not isinstance(routes, str):
            raise TypeError(f"meta_info.routed_experts is a {type(routes).__name__}, not base64")
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise UpstreamError(f"the model server's reply is not SGLang's /generate shape: {e!r}") from None
    return Generation(ids, logprobs, kind, matched, None if version is None else str(version), routes)


def registry_servers(registry: Registry, *, role: str = "inference", ttl_s: float = 30.0,
                     refresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> Callable[[], list[str]]:
    """The URLs of `role` services with a fresh heartbeat, re-read from the registry at most every refresh_s
    seconds of `clock`."""
    cache: dict[str, Any] = {"at": float("-inf"), "urls": []}

    def servers() -> list[str]:
        now = clock()
        if now - cache["at"] > refresh_s:
            cache["urls"] = [f"http://{r.host}:{r.port}" for r in registry.alive(role, ttl_s) if r.port]
            cache["at"] = now
        return cache["urls"]
    return servers


class UpstreamPool:
    """Model servers: a fixed list of URLs, or a function giving the live ones (`registry_servers`).

    `pick()` gives a session its server, `generate()` calls it."""

    def __init__(self, servers: Sequence[str] | Callable[[], Sequence[str]], *, timeout_s: float = 600.0,
                 transport: httpx.AsyncBaseTransport | None = None):
        if not callable(servers):
            if not servers:
                raise ValueError("no upstream model servers: give --upstream URL[,URL...]")
            fixed = [u.rstrip("/") for u in servers]
            servers = lambda: fixed  # noqa: E731
        self.servers = servers
        self._turn = itertools.count()
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), transport=transport,
                                         limits=httpx.Limits(max_connections=512, max_keepalive_connections=128))

    def pick(self) -> str:
        """The next live server, round robin."""
        live = list(self.servers())
        if not live:
            raise UpstreamError("no model server is live (none registered, or every heartbeat is stale)")
        return live[next(self._turn) % len(live)]

    async def generate(self, url: str, input_ids: Sequence[int], sampling: dict[str, Any], *,
                       routes_from: int | None = None) -> Generation:
        t0 = time.monotonic()
        try:
            # orjson writes a 96k-token prompt in well under a millisecond; json.dumps takes ~8 ms.
            body = orjson.dumps(sglang_payload(input_ids, sampling, routes_from=routes_from),
                                option=orjson.OPT_SERIALIZE_NUMPY)
            r = await self._client.post(f"{url}/generate", content=body,
                                        headers={"content-type": "application/json"})
        except httpx.HTTPError as e:
            raise UpstreamError(f"{url}/generate failed after {time.monotonic() - t0:.1f} s: {e!r}") from None
        if r.status_code != 200:
            raise UpstreamError(f"{url}/generate answered {r.status_code}: {r.text[:300]}")
        try:
            return parse_generation(orjson.loads(r.content))
        except orjson.JSONDecodeError as e:
            raise UpstreamError(f"{url}/generate sent invalid JSON: {e}") from None

    async def healthy(self) -> str | None:
        """A live server that answers GET /health with 200 now, or None."""
        for url in list(self.servers()):
            try:
                r = await self._client.get(f"{url}/health", timeout=HEALTH_TIMEOUT_S)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                return url
        return None

    async def wait_healthy(self, poll_s: float = 1.0, *, what: str = "work") -> str:
        """Return once a server answers /health (at once when one does), saying so in the log when
        there was a wait: an attempt started against a dead server fails and spends a try of its
        attempt, and a server killed and restarted would otherwise spend every try in reach."""
        url = await self.healthy()
        if url is not None:
            return url
        t0 = time.monotonic()
        log.warning("%s waits: no model server answers /health (%s)", what,
                    ", ".join(self.servers()) or "none is registered")
        while (url := await self.healthy()) is None:
            await asyncio.sleep(poll_s)
        log.info("%s goes on after %.1f s: %s answers /health", what, time.monotonic() - t0, url)
        return url

    async def aclose(self) -> None:
        await self._client.aclose()
