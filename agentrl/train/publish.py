"""Weight publishing: every inference server reloads the new weights before the next rollout opens.

Per server, over SGLang's HTTP API (hpc.inference.sglang.SGLangClient): pause generation, update
weights from disk (the checkpoint's HF export) with the new weight_version, flush the prefix cache
(its entries were computed by the old weights), continue; then the server must report the new
version. Servers are reloaded in parallel, and a failure names the server and the step that failed
(a call that fails raises SGLangError; PublishError, one, is what publish_weights raises).

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

from hpc.inference.sglang import SGLangClient, SGLangError


class PublishError(SGLangError):
    """The new weights did not reach every server, or a server reports another version after the reload."""


def reload_one(client: SGLangClient, model_path: Path, version: int) -> float:
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
                    client: Callable[[str], SGLangClient] | None = None) -> dict[str, float]:
    """Reload every server (in parallel); seconds per server. Raises PublishError naming each failure."""
    if not servers:
        return {}
    make = client or (lambda url: SGLangClient(url, timeout_s))
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

    def __init__(self, clients: Sequence[SGLangClient]):
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
