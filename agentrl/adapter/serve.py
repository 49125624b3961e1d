"""Running the adapter: uvicorn on a TCP port and, for sandboxes, on a Unix socket.

`AdapterServer` runs it in a background thread of this process (tests, an eval run, a pool
worker that shares its adapter); the stand-alone command is agentrl/commands/adapter_serve.py.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the CLI builds its parser without loading the web stack
    from .service import Adapter


# The longest path a Unix socket's address holds: sun_path is 108 bytes with its terminating NUL (unix(7))
UDS_PATH_MAX = 107


def check_socket_path(uds: str) -> None:
    """Refuse, before anything starts, a socket path that bind(2) would refuse later, deep in a server's start
    (where a pool worker would take every attempt's failed sandbox for an infrastructure failure)."""
    size = len(os.fsencode(uds))
    if size > UDS_PATH_MAX:
        raise ValueError(f"the adapter's Unix socket {uds} is a path of {size} bytes, past the {UDS_PATH_MAX} a "
                         "socket's address holds: give it a shorter directory (a pool or eval puts it in "
                         "pool.scratch_dir; the default, the node's /tmp, is short)")


class AdapterServer:
    """The adapter on 127.0.0.1:port (0: an ephemeral port) and optionally a Unix socket, in a thread."""

    def __init__(self, adapter: Adapter, *, host: str = "127.0.0.1", port: int = 0, uds: str | None = None,
                 control_token: str | None = None):
        import uvicorn

        if uds:
            check_socket_path(uds)

        from .app import create_app

        self.adapter = adapter
        self.control_token = control_token or secrets.token_urlsafe(32)
        app = create_app(adapter, self.control_token)
        self._servers = [uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                       lifespan="off", access_log=False))]
        if uds:
            # uvicorn makes the socket 0666: the agent (uid 1000) in a sandbox must connect to it.
            self._servers.append(uvicorn.Server(uvicorn.Config(app, uds=uds, log_level="warning", lifespan="off",
                                                               access_log=False)))
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.host, self.uds = host, uds
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def serve(self) -> None:
        """Serve until `stop()`; in the caller's event loop."""
        tasks = [asyncio.ensure_future(s.serve()) for s in self._servers]
        while not all(s.started for s in self._servers):
            if any(t.done() for t in tasks):
                for t in tasks:
                    if t.done():
                        t.result()     # raises the bind error
                raise RuntimeError("the adapter server stopped while starting")
            await asyncio.sleep(0.01)
        sockets = [sock for server in self._servers[0].servers for sock in server.sockets]
        if sockets:                    # none if stopped while it started
            self.port = sockets[0].getsockname()[1]
        await asyncio.gather(*tasks)
        await self.adapter.pool.aclose()

    def start(self) -> AdapterServer:
        ready, failure = threading.Event(), []

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            task = self._loop.create_task(self.serve())

            async def watch():
                while not all(s.started for s in self._servers) and not task.done():
                    await asyncio.sleep(0.01)
                if task.done() and task.exception():
                    failure.append(task.exception())
                ready.set()
            self._loop.create_task(watch())
            try:
                self._loop.run_until_complete(task)
            except BaseException as e:  # noqa: BLE001 - reported to the starting thread
                failure.append(e)
                ready.set()
        self._thread = threading.Thread(target=run, name="agentrl-adapter", daemon=True)
        self._thread.start()
        started = ready.wait(30)
        if failure:
            raise RuntimeError(f"the adapter did not start: {failure[0]}")
        if not started:
            self.request_stop()
            raise RuntimeError(f"the adapter did not start listening within 30 s ({self.url}"
                               f"{', ' + self.uds if self.uds else ''})")
        return self

    def request_stop(self) -> None:
        """Ask `serve()` to return (it finishes the requests in flight first)."""
        for s in self._servers:
            s.should_exit = True

    def stop(self) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(15)

    def __enter__(self) -> AdapterServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
