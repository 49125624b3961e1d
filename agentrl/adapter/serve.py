"""Running the adapter: uvicorn on a TCP port and, for sandboxes, on a Unix socket.

    agentrl adapter serve --upstream URL[,URL...] --tokenizer DIR --port P [--uds PATH]

`AdapterServer` runs it in a background thread of this process (tests, an eval run, a pool
worker that shares its adapter); `main` is the stand-alone command.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", required=True,
                   help="SGLang server URL(s), comma-separated, or registry:RUN_DIR for the run's live servers")
    p.add_argument("--tokenizer", required=True, type=Path, help="the model's (or its tokenizer's) HF directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    p.add_argument("--uds", help="also serve on this Unix socket (what sandboxes bind-mount)")
    from .settings import AdapterSettings

    d = {name: f.default for name, f in AdapterSettings.model_fields.items()}   # one default each: the settings'
    p.add_argument("--tool-parser", help=f"qwen3_coder | qwen25 | hermes | none (default {d['tool_parser']})")
    p.add_argument("--reasoning-parser", help=f"qwen3 | none (default {d['reasoning_parser']})")
    p.add_argument("--max-context", type=int, help=f"tokens of prompt + output per turn (default {d['max_context']})")
    p.add_argument("--max-new-tokens", type=int, help=f"cap on output tokens per turn (default {d['max_new_tokens']})")
    p.add_argument("--public-url", help="the base URL clients should use, when it is not http://host:port")
    p.add_argument("--keepalive-s", type=float, help="seconds between keepalives while a streamed turn waits for the "
                                                      f"model (0.01..60, default {d['keepalive_s']})")
    p.add_argument("--open-unknown-keys", action="store_true",
                   help="an unknown API key opens a session on first use (pointing a CLI at a model by hand)")
    p.add_argument("--no-incremental", action="store_true",
                   help="render and tokenize every chat whole (a baseline for benchmarks, or to rule this out)")
    p.add_argument("--control-token-file", type=Path,
                   help="write the token of the /_agentrl control routes here (mode 0600)")


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from hpc.validation import problems

    from .service import Adapter, AdapterConfig

    flags = {"tool_parser": args.tool_parser, "reasoning_parser": args.reasoning_parser,
             "max_context": args.max_context, "max_new_tokens": args.max_new_tokens, "keepalive_s": args.keepalive_s}
    # the flags given (a parser "none": no parser); the others keep AdapterSettings' defaults
    settings: dict[str, Any] = {k: None if v in ("none", "") else v for k, v in flags.items() if v is not None}
    upstream = args.upstream.strip()
    if upstream.startswith("registry:"):
        settings["registry"] = Path(upstream.removeprefix("registry:"))
    else:
        settings["upstreams"] = [u for u in upstream.split(",") if u]
    try:
        config = AdapterConfig(tokenizer=args.tokenizer, public_url=args.public_url,
                               open_unknown_keys=args.open_unknown_keys, incremental=not args.no_incremental,
                               **settings)
    except ValidationError as e:
        for field, msg in problems(e):
            print(f"agentrl adapter serve: {field or 'config'}: {msg}", file=sys.stderr)
        return 2
    token = secrets.token_urlsafe(32)
    if args.control_token_file:
        fd = os.open(args.control_token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    server = AdapterServer(Adapter(config), host=args.host, port=args.port, uds=args.uds, control_token=token)

    async def go() -> None:
        serving = asyncio.ensure_future(server.serve())
        while server.port == 0 or not all(s.started for s in server._servers):
            if serving.done():
                return serving.result()
            await asyncio.sleep(0.05)
        print(f"agentrl adapter listening on {server.url}" + (f" and {args.uds}" if args.uds else ""), flush=True)
        await serving
    try:
        asyncio.run(go())
    except OSError as e:
        print(f"agentrl adapter serve: cannot listen: {e}", file=sys.stderr)
        return 1
    return 0
