"""Weight publishing: every inference server reloads the new weights before the next rollout opens.

Per server, over SGLang's HTTP API: pause generation, update weights from disk (the checkpoint's HF
export) with the new weight_version, flush the prefix cache (its entries were computed by the old
weights), continue; then the server must report the new version. Servers are reloaded in parallel,
and a failure names the server and the step that failed.

Colocated (trainer and SGLang on the same GPUs): `ColocatedInference` releases the servers' GPU memory
for training and takes it back afterwards. The caller closes the rollout first, so that no sandbox is
still waiting on a generation when memory goes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx


class PublishError(RuntimeError):
    pass


class InferenceClient:
    def __init__(self, url: str, timeout_s: float = 600.0, transport: httpx.BaseTransport | None = None):
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, transport=transport)

    def _post(self, path: str, body: dict[str, Any] | None = None, *, json_reply: bool = False) -> dict[str, Any]:
        """POST; the reply's JSON. SGLang answers some calls in text (/flush_cache: "Cache flushed."): with
        json_reply, a 200 that is not JSON is an error (a proxy's page proves nothing), else it is {}."""
        try:
            r = self._http.post(path, json=body or {})
        except httpx.HTTPError as e:
            raise PublishError(f"{self.url}{path}: {e!r}") from None
        if r.status_code != 200:
            raise PublishError(f"{self.url}{path} answered {r.status_code}: {r.text[:300]}")
        try:
            return r.json() if r.content or json_reply else {}
        except ValueError:
            if json_reply:
                raise PublishError(f"{self.url}{path} answered 200 with no JSON: {r.text[:300]!r}") from None
            return {}

    def pause(self) -> None:
        self._post("/pause_generation")

    def resume(self) -> None:
        self._post("/continue_generation")

    def flush_cache(self) -> None:
        self._post("/flush_cache")

    def update_weights(self, model_path: Path, version: int) -> None:
        reply = self._post("/update_weights_from_disk", {"model_path": str(model_path), "weight_version": str(version)},
                           json_reply=True)
        if reply.get("success") is False:
            raise PublishError(f"{self.url} did not load {model_path}: {reply.get('message', reply)}")

    def weight_version(self) -> str | None:
        try:
            # SGLang 0.5.12 names it /model_info (/get_model_info still answers, with a warning per call).
            r = self._http.get("/model_info")
            if r.status_code == 404:
                r = self._http.get("/get_model_info")
            info = r.json()
        except (httpx.HTTPError, ValueError) as e:
            raise PublishError(f"{self.url}/model_info: {e!r}") from None
        version = info.get("weight_version")
        return None if version is None else str(version)

    def release_memory(self) -> None:
        self._post("/release_memory_occupation")

    def resume_memory(self) -> None:
        self._post("/resume_memory_occupation")

    def close(self) -> None:
        self._http.close()


def reload_one(client: InferenceClient, model_path: Path, version: int) -> float:
    """Pause, load, flush, continue; the seconds it took. The server keeps serving old weights on failure."""
    t0 = time.monotonic()
    client.pause()
    try:
        client.update_weights(model_path, version)
        client.flush_cache()
    finally:
        client.resume()
    found = client.weight_version()
    if found != str(version):
        raise PublishError(f"{client.url} reports weight_version {found!r} after loading version {version}")
    return time.monotonic() - t0


def publish_weights(servers: Sequence[str], model_path: Path, version: int, *, timeout_s: float = 600.0,
                    client: Callable[[str], InferenceClient] | None = None) -> dict[str, float]:
    """Reload every server (in parallel); seconds per server. Raises PublishError naming each failure."""
    if not servers:
        return {}
    make = client or (lambda url: InferenceClient(url, timeout_s))
    clients = [make(url) for url in servers]
    try:
        with ThreadPoolExecutor(max_workers=len(clients)) as pool:
            futures = {c.url: pool.submit(reload_one, c, model_path, version) for c in clients}
        failures = [f"{url}: {f.exception()}" for url, f in futures.items() if f.exception() is not None]
        if failures:
            raise PublishError(f"weights v{version} did not reach every server:\n  " + "\n  ".join(failures))
        return {url: f.result() for url, f in futures.items()}
    finally:
        for c in clients:
            c.close()


class ColocatedInference:
    """Around a training phase on GPUs shared with SGLang: pause and release before, resume after."""

    def __init__(self, clients: Sequence[InferenceClient]):
        self.clients = list(clients)
        self.paused = self.released = False

    def __enter__(self) -> ColocatedInference:
        self.paused = True
        for c in self.clients:
            c.pause()
        self.released = True
        for c in self.clients:
            c.release_memory()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.released:
            for c in self.clients:
                c.resume_memory()
            self.released = False

    def resume(self, model_path: Path | None, version: int) -> None:
        """Continue generating, after loading new weights (when given) into the memory taken back."""
        if not self.paused:
            return
        self.paused = False
        for c in self.clients:
            if model_path is not None:
                c.update_weights(model_path, version)
                c.flush_cache()
            c.resume()
            if model_path is not None and c.weight_version() != str(version):
                raise PublishError(f"{c.url} did not report weight_version {version} after the reload")
