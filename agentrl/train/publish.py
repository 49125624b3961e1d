"""Weight publishing: every inference server reloads the new weights before the next rollout opens.

Per server, over SGLang's HTTP API (hpc.inference.sglang.SGLangClient): pause generation, update
weights from disk (the checkpoint's HF export) with the new weight_version, flush the prefix cache
(its entries were computed by the old weights), continue; then the server must report the new
version. Servers are reloaded in parallel, and a failure names the server and the step that failed
(a call that fails raises SGLangError; PublishError, one, is what publish_weights raises).

A server that does not answer at all may be restarting (the launcher restarts a dead one, and it
loads the weights the run last published: the caller records them first). It is asked again until
it reports the new version, or is no longer live, or the time is up; a server that answers with a
refusal fails the publish at once. With rollouts running ahead of training a server dies mid-publish
as easily as mid-rollout, and neither may end the run.

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

from hpc.inference.sglang import ServerUnreachable, SGLangClient, SGLangError


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


def _confirm_or_reload(client: SGLangClient, model_path: Path, version: int) -> float:
    """A server asked again: one that restarted has loaded the published weights itself."""
    t0 = time.monotonic()
    if client.weight_version() == str(version):
        return time.monotonic() - t0
    return reload_one(client, model_path, version)


def publish_weights(servers: Sequence[str] | Callable[[], Sequence[str]], model_path: Path, version: int, *,
                    timeout_s: float = 600.0, client: Callable[[str], SGLangClient] | None = None,
                    retry_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> dict[str, float]:
    """Reload every live server (in parallel); seconds per server. `servers`: the URLs, or a function giving
    the live ones, asked again each round. Raises PublishError naming each failure: a refusal at once, a
    server that stays unreachable (and live) after timeout_s."""
    live = servers if callable(servers) else (lambda: servers)
    make = client or (lambda url: SGLangClient(url, timeout_s))
    deadline = clock() + timeout_s
    done: dict[str, float] = {}
    reload: Callable[[SGLangClient, Path, int], float] = reload_one
    while True:
        clients = [make(url) for url in live() if url not in done]
        if not clients:
            return done
        try:
            with ThreadPoolExecutor(max_workers=len(clients)) as pool:
                futures = {c.url: pool.submit(reload, c, model_path, version) for c in clients}
        finally:
            for c in clients:
                c.close()
        errors = {url: f.exception() for url, f in futures.items() if f.exception() is not None}
        done.update({url: f.result() for url, f in futures.items() if url not in errors})
        refused = {url: e for url, e in errors.items() if not isinstance(e, ServerUnreachable)}
        if refused or (errors and clock() >= deadline):
            raise PublishError(f"weights v{version} did not reach every server:\n  " +
                               "\n  ".join(f"{url}: {e}" for url, e in (refused or errors).items()))
        if not errors:
            return done
        sleep(retry_s)
        reload = _confirm_or_reload


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
