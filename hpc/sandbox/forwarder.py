"""TCP on the sandbox's loopback -> the adapter's Unix socket (for CLIs that only speak TCP).

`python -m hpc.sandbox.forwarder --port P --unix PATH`, run by the Apptainer runtime inside its
instance; the bwrap runtime's supervisor serves the same `handler` on a socket it made in the
sandbox's network namespace. Either way it can reach nothing but that one socket.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def handler(unix_path: str):
    """asyncio.start_server's callback: each TCP client gets a connection of its own to `unix_path`."""
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_unix_connection(unix_path)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
    return handle


async def serve(port: int, unix_path: str) -> None:
    server = await asyncio.start_server(handler(unix_path), "127.0.0.1", port)
    print(f"listening on 127.0.0.1:{port} -> {unix_path}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpc.sandbox.forwarder")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--unix", required=True)
    args = ap.parse_args(argv)
    # lo is down in a fresh network namespace until someone raises it; bwrap raises it, this is a guard.
    asyncio.run(serve(args.port, args.unix))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
