"""`agentrl adapter serve --upstream URL[,URL...] --tokenizer DIR --port P [--uds PATH]`: the adapter stand-alone.

The Anthropic and OpenAI APIs over SGLang /generate (docs/adapter.md), on a TCP port and, with --uds, a
Unix socket; --upstream registry:RUN_DIR follows a run's live inference servers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from ..adapter.serve import AdapterServer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", required=True,
                   help="SGLang server URL(s), comma-separated, or registry:RUN_DIR for the run's live servers")
    p.add_argument("--tokenizer", required=True, type=Path, help="the model's (or its tokenizer's) HF directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    p.add_argument("--uds", help="also serve on this Unix socket (what sandboxes bind-mount)")
    from ..adapter.settings import AdapterSettings

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

    from ..adapter.service import Adapter, AdapterConfig

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
