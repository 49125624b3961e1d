"""A CPU stand-in for SGLang's HTTP server: a small HF causal LM behind the part of SGLang's API this project uses.

    python -m hpc.inference.cpu_server --model DIR --port P [--host H] [--register RUN_DIR --index I]
                                       [--device cpu|cuda]

`hpc.inference.generation` holds /generate's logic (request, sampling, logprobs, finish); this
module the model, the HTTP routes and the command. Routes and shapes as read in SGLang 0.5's
source (sgl-project/sglang: entrypoints/http_server.py, managers/io_struct.py,
managers/tokenizer_manager.py):
- `POST /generate`: one request with `input_ids`; the reply documented in tests/scripted_upstream.py.
  Errors are 400 {"error": {"message": ...}}. Requests run one at a time, in arrival order.
- `GET /health` (200, empty); `GET /get_model_info` and `/model_info` (model_path, tokenizer_path,
  is_generation, preferred_sampling_params, weight_version, ...); `GET /weight_version`.
- `GET|POST /flush_cache`: SGLang's text reply; 400 while requests are in flight. Nothing here
  outlives a request, so there is nothing to flush.
- `POST /update_weights_from_disk` {model_path, weight_version?, abort_all_requests?} -> {success,
  message, num_paused_requests}; 400 on failure, the old weights kept. Unless generation is paused
  it waits for the requests in flight and holds back new ones (SGLang's model-update writer lock), so
  a reply never mixes two policies. weight_version changes only when given; model_path becomes the
  new path ("default" is SGLang's initial weight_version).
- `POST /pause_generation` {mode: "abort" (SGLang's default) | "in_place" | "retract"} ->
  {"message": "Generation paused successfully.", "status": "ok"}. New requests wait for
  `POST /continue_generation`. "abort" ends the requests in flight at once: each answers 200 with
  the tokens it has and finish_reason {"type": "abort", "message": "Aborted", ...}; as SGLang's
  tokenizer manager (it aborts until no request holds the model-update lock), the reply comes once
  none is left in flight, so a /flush_cache after it succeeds. "in_place" and
  "retract" hold them between two tokens; after new weights both recompute the prefix (SGLang's
  in_place would keep the old KV cache).
- `return_routed_experts` (with --enable-return-routed-experts, for an MoE model) and
  `routed_experts_start_len`: meta_info.routed_experts, hpc.inference.routing's wire form. Asked of a
  server started without the flag, the stand-in refuses (400).
- --dtype bfloat16 serves the weights in bfloat16 (SGLang's usual dtype) against a float32 trainer.
Not mirrored: text prompts, batches, streaming, stop strings, penalties, grammars, top and input logprobs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from .. import liveness
from . import routing

if TYPE_CHECKING:
    from ..registry import Registry, ServiceRecord
from .generation import (
    GenerateRequest,
    RequestError,
    abort_reason,
    choose_token,
    finish_reason,
    generate_reply,
    parse_generate,
    request_seed,
    text_ids,
)

PAUSE_MODES = ("abort", "in_place", "retract")
DTYPES = ("float32", "bfloat16")
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. "
           "(When there are running or waiting requests, the operation will not be performed.)\n")


class Gate:
    """Pause, continue and abort, seen by the worker thread between two tokens."""

    def __init__(self):
        self._cond = threading.Condition()
        self.paused = False
        self.epoch = 0          # bumped by every abort; a request started in an older epoch is aborted

    def pause(self, mode: str) -> None:
        self._set(paused=True, abort=mode == "abort")

    def abort_all(self) -> None:
        self._set(paused=None, abort=True)

    def resume(self) -> None:
        self._set(paused=False, abort=False)

    def _set(self, *, paused: bool | None, abort: bool) -> None:
        with self._cond:
            self.paused = self.paused if paused is None else paused
            self.epoch += abort
            self._cond.notify_all()

    def proceed(self, ticket: int) -> bool:
        """False once the request holding `ticket` is aborted; waits while paused."""
        with self._cond:
            self._cond.wait_for(lambda: self.epoch != ticket or not self.paused)
            return self.epoch == ticket


# torch's intra-op threads while a server runs. A decode step of a tiny model is too small to split well, and the
# server is never alone on its node: beside one busy core a step took 21.9 ms on two threads (each step's barrier
# waits for a core the sandboxes hold) against 6.5 ms on one; idle, 5.4 against 6.6
# (benchmarks/server_threads_bench.py).
SERVER_THREADS = 1


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads at `n` for the block, then back: the count is the whole process's."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Engine:
    """The model, its tokenizer and weight version; one request generates at a time (`generate`)."""

    def __init__(self, model_dir: Path | str, *, weight_version: str = "default", random_seed: int = 0,
                 original_logprob: bool | None = None, device: str = "cpu", dtype: str = "float32",
                 return_routed_experts: bool = False):
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        # The forward pass runs on `device` ("cuda" on a GPU node); sampling stays on the CPU, with the
        # same generator and seeds, so a GPU changes the logits' last bits and nothing else.
        self.device, self.dtype = device, dtype
        self.model_path = self.tokenizer_path = str(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        self.model = self._load(self.model_path)
        config = self.model.config
        self.vocab_size, self.context_len = config.vocab_size, config.max_position_embeddings
        self.eos_ids = frozenset(_ids(config.eos_token_id) | _ids(self.model.generation_config.eos_token_id)
                                 | _ids(self.tokenizer.eos_token_id))
        self.weight_version = weight_version
        self.random_seed, self._fallback = random_seed, random.Random(random_seed)
        if original_logprob is None:   # read as SGLang reads it (get_bool_env_var)
            original_logprob = os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "false").lower() in ("true", "1")
        self.original_logprob = original_logprob
        # SGLang's --enable-return-routed-experts: a request may then ask for its tokens' experts
        self.moe = routing.moe_shape(config)
        if return_routed_experts and self.moe is None:
            raise ValueError(f"return_routed_experts: the model at {model_dir} has no MoE layer whose experts "
                             "could be returned; leave it off for a dense model")
        self.return_routed_experts = return_routed_experts
        self.gate = Gate()
        self._model_lock = threading.Lock()    # held for one forward step, and to swap weights
        self._weights_serial = 0

    def _load(self, path: str):
        import torch
        from transformers import AutoModelForCausalLM

        # bfloat16 is SGLang's usual serving dtype against a float32 trainer: a real source of mismatch
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, self.dtype))
        # transformers wraps `to` with functools.wraps(Module.to): typeshed's _Wrapped takes the device for self
        return model.to(self.device).eval()  # type: ignore[arg-type]

    def check(self, request: GenerateRequest) -> None:
        """What the parser cannot know: whether this server can answer the request (RequestError if not)."""
        if request.return_routed_experts and not self.return_routed_experts:
            raise RequestError("return_routed_experts: the server was started without --enable-return-routed-experts")

    def generate(self, request: GenerateRequest, ticket: int) -> dict[str, Any]:
        import torch

        sampling = request.sampling
        self.check(request)
        output_ids: list[int] = []
        logprobs: list[float] = []
        routes: list = []       # per position fed, its [layers, top_k] experts (with return_routed_experts)
        generator = None if sampling.greedy else torch.Generator().manual_seed(
            request_seed(request, self.random_seed, self._fallback))
        cache, cache_serial = None, -1
        finish = finish_reason(output_ids, sampling, self.eos_ids)
        while finish is None:
            if not self.gate.proceed(ticket):
                finish = abort_reason()
                break
            with self._model_lock, torch.inference_mode():
                if cache_serial != self._weights_serial:   # new weights: recompute the prefix with them
                    cache, cache_serial = None, self._weights_serial
                done = cache.get_seq_length() if cache is not None else 0
                feed = torch.tensor([[*request.input_ids, *output_ids][done:]], device=self.device)
                with routing.capture(self.model) if request.return_routed_experts else nullcontext() as calls:
                    out = self.model(input_ids=feed, cache=cache, use_cache=True)
                if calls is not None:       # a recomputed prefix replaces its positions' routes
                    routes[done:] = list(routing.captured(calls))
                cache = out.cache
            token, logprob = choose_token(out.logits[0, -1].cpu(), sampling, generator,
                                          original_logprob=self.original_logprob)
            output_ids.append(token)
            logprobs.append(logprob)
            finish = finish_reason(output_ids, sampling, self.eos_ids)
        # transformers types decode's result str | list[str] for every input: one id list decodes to a str
        text = cast(str, self.tokenizer.decode(text_ids(output_ids, finish, sampling),
                                               skip_special_tokens=sampling.skip_special_tokens))
        experts = None
        if request.return_routed_experts:    # positions [start, seqlen - 1): the last output token was never fed
            assert self.moe is not None
            fed = len(request.input_ids) + len(output_ids) - 1
            rows = routes[request.routed_experts_start_len:fed]
            experts = routing.encode(np.stack(rows) if rows else np.zeros((0, *self.moe[:2]), np.int32))
        return generate_reply(request, output_ids, logprobs, finish, text=text, weight_version=self.weight_version,
                              routed_experts=experts)

    def load_weights(self, model_path: str, weight_version: str | None) -> tuple[bool, str]:
        """Swap in the weights at model_path if they fit this model; between two tokens of any request."""
        try:
            model = self._load(model_path)
        except Exception as e:  # noqa: BLE001 - any load failure is the caller's answer, not a crash
            return False, f"Failed to load the weights at {model_path}: {e}"
        old = {k: tuple(v.shape) for k, v in self.model.state_dict().items()}
        new = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        if old != new:
            differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            return False, f"The weights at {model_path} do not fit the served model: {differ[:5]} differ"
        with self._model_lock:
            self.model, self.model_path = model, model_path
            self._weights_serial += 1
            if weight_version is not None:
                self.weight_version = weight_version
        return True, "Succeeded to update model weights."

    def model_info(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "tokenizer_path": self.tokenizer_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": self.weight_version,
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": self.model.config.model_type, "architectures": self.model.config.architectures}


def _ids(value: Any) -> set[int]:
    return set() if value is None else {value} if isinstance(value, int) else set(value)


def create_app(engine: Engine) -> FastAPI:
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpu-server-model")

    @asynccontextmanager
    async def lifespan(_app):
        yield
        engine.gate.abort_all()     # a request held by a pause must not keep the worker thread alive
        worker.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(lifespan=lifespan)
    admission = asyncio.Condition()      # new requests wait here while paused or while weights load
    state = {"in_flight": 0, "updating": False}
    update_lock = asyncio.Lock()

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status_code=status)

    async def json_body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = await request.json() if raw.strip() else {}
        except ValueError as e:
            raise RequestError(f"the body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        return body

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return engine.model_info()

    @app.get("/weight_version")
    async def weight_version() -> dict[str, Any]:
        return {"weight_version": engine.weight_version}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        # Nothing outlives a request here, so there is nothing to flush; SGLang refuses while busy.
        return Response(FLUSHED, status_code=400 if state["in_flight"] else 200)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        try:
            parsed = parse_generate(await json_body(request), vocab_size=engine.vocab_size,
                                    context_len=engine.context_len)
            engine.check(parsed)
        except RequestError as e:
            return error(400, str(e))
        async with admission:
            await admission.wait_for(lambda: not engine.gate.paused and not state["updating"])
            state["in_flight"] += 1
            ticket = engine.gate.epoch
        try:
            reply = await asyncio.get_running_loop().run_in_executor(worker, engine.generate, parsed, ticket)
        finally:
            async with admission:
                state["in_flight"] -= 1
                admission.notify_all()
        return JSONResponse(reply)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        try:
            body = await json_body(request)
        except RequestError as e:
            return error(400, str(e))
        path, version = body.get("model_path"), body.get("weight_version")
        if not isinstance(path, str) or not path or (version is not None and not isinstance(version, str)):
            return error(400, "model_path must be a path and weight_version, if given, a string")
        async with update_lock:
            if body.get("abort_all_requests"):
                engine.gate.abort_all()
            async with admission:
                state["updating"] = True
                # SGLang takes its model-update writer lock unless paused: requests finish on one policy.
                await admission.wait_for(lambda: engine.gate.paused or state["in_flight"] == 0)
            try:
                ok, message = await asyncio.to_thread(engine.load_weights, path, version)
            finally:
                async with admission:
                    state["updating"] = False
                    admission.notify_all()
        return JSONResponse({"success": ok, "message": message, "num_paused_requests": 0},
                            status_code=200 if ok else 400)

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> Response:
        try:
            mode = (await json_body(request)).get("mode", "abort")
        except RequestError as e:
            return error(400, str(e))
        if mode not in PAUSE_MODES:
            return error(400, f"Invalid mode: {mode!r}. Expected one of {list(PAUSE_MODES)}.")
        engine.gate.pause(mode)
        async with admission:
            admission.notify_all()     # a weight update waiting for requests in flight may go now
            if mode == "abort":
                # SGLang returns only once the aborted requests are gone: its update_weights_from_disk then
                # flushes the prefix cache, and that flush fails (an assert) while any request is running.
                await admission.wait_for(lambda: state["in_flight"] == 0)
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> Response:
        engine.gate.resume()
        async with admission:
            admission.notify_all()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    return app


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # A socket handed to uvicorn keeps Nagle's algorithm: each reply then waits ~40 ms for a delayed ACK.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


class ServerThread:
    """`with ServerThread(engine) as server:` serves on `server.url` (127.0.0.1, a free port) in a thread."""

    def __init__(self, engine: Engine, *, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.engine = engine
        self._sock = _bind(host, port)
        self.url = f"http://{host}:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(create_app(engine), log_level="warning", timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the CPU inference server failed to start")
            self._thread.join(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.engine.gate.abort_all()
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._sock.close()
        if self._thread.is_alive():
            raise RuntimeError("the CPU inference server did not stop within 15 s")


def registry_weight_version(version: str) -> int | None:
    """The registry keeps integer versions; SGLang's are strings, "default" until a trainer names one."""
    return int(version) if version.isdecimal() else None


@dataclass(frozen=True)
class ServeOptions:
    """How the server serves: its model, where it listens, and whether it registers in a run (what main's flags
    set, and the inference role's `engine: cpu` section through hpc.inference.serve)."""
    model: Path
    host: str = "127.0.0.1"
    port: int = 30000                    # 0: any free port
    weight_version: str = "default"
    random_seed: int = 0                 # seeds requests that give no sampling_seed
    register: Path | None = None         # a run directory: registered in its services/ as inference
    index: int = 0                       # the registry index
    heartbeat_s: float = 5.0
    liveness_file: Path | None = None    # touched at each heartbeat (hpc.liveness)
    device: str = "cpu"
    threads: int = SERVER_THREADS        # torch's intra-op threads while it serves
    dtype: str = "float32"               # or bfloat16
    enable_return_routed_experts: bool = False


async def serve(engine: Engine, args: ServeOptions) -> None:
    """Serve until SIGTERM or SIGINT; registered in RUN/services meanwhile, with `register`."""
    import uvicorn

    sock = _bind(args.host, args.port)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning", timeout_graceful_shutdown=5))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            return await serving
        await asyncio.sleep(0.02)
    registry: Registry | None = None
    record: ServiceRecord | None = None
    if args.register:
        registry, record = _register(engine, args, port)
    print(f"cpu_server: listening on http://{args.host}:{port} (model {engine.model_path})", flush=True)
    try:
        beat = time.monotonic()
        while not server.should_exit and not serving.done():   # uvicorn sets should_exit on a signal
            await asyncio.sleep(0.1)
            if registry is not None and record is not None and time.monotonic() - beat >= args.heartbeat_s:
                version = registry_weight_version(engine.weight_version)
                record = await asyncio.to_thread(registry.heartbeat, record, weight_version=version)
                liveness.beat(args.liveness_file)
                beat = time.monotonic()
        engine.gate.abort_all()     # so that a paused request cannot hold up the shutdown
        await serving
    finally:
        if registry is not None and record is not None:
            registry.deregister(record)


def _register(engine: Engine, args: ServeOptions, port: int) -> tuple[Registry, ServiceRecord]:
    from ..registry import Registry
    from ..runlayout import RunLayout

    assert args.register is not None
    registry = Registry(RunLayout.open(args.register).services_dir)
    host = socket.gethostname() if args.host in ("0.0.0.0", "::", "") else args.host
    return registry, registry.register("inference", args.index, host=host, port=port,
                                       weight_version=registry_weight_version(engine.weight_version))


def _check_device(ap: argparse.ArgumentParser, device: str) -> None:
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError as e:
        ap.error(f"--device {device}: {e}")
    if kind == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {device}: torch {torch.__version__} sees no CUDA GPU here (built for CUDA "
                 f"{torch.version.cuda or 'none'}): run on a GPU node, or leave --device at cpu")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpc.inference.cpu_server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path, help="a Hugging Face model directory")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000, help="0: any free port")
    ap.add_argument("--weight-version", default="default")
    ap.add_argument("--random-seed", type=int, default=0, help="seeds requests that give no sampling_seed")
    ap.add_argument("--register", type=Path, metavar="RUN_DIR", help="register in RUN_DIR/services as inference")
    ap.add_argument("--index", type=int, default=0, help="the registry index (with --register)")
    ap.add_argument("--heartbeat-s", type=float, default=5.0)
    ap.add_argument("--liveness-file", type=Path, help="touched at each heartbeat (hpc.liveness)")
    ap.add_argument("--device", default="cpu", help="where the forward pass runs: cpu (default), cuda, cuda:N")
    ap.add_argument("--threads", type=int, default=SERVER_THREADS,
                    help=f"torch's intra-op threads (default {SERVER_THREADS})")
    ap.add_argument("--dtype", default="float32", choices=DTYPES, help="the served weights' dtype (default float32)")
    ap.add_argument("--enable-return-routed-experts", action="store_true",
                    help="an MoE model: requests may ask for each token's experts (return_routed_experts)")
    args = ap.parse_args(argv)
    _check_device(ap, args.device)
    if args.threads < 1:
        ap.error(f"--threads must be 1 or more, got {args.threads}")
    return run(ServeOptions(**vars(args)))


def run(opts: ServeOptions) -> int:
    """Serve `opts.model` until SIGTERM or SIGINT; 0."""
    engine = Engine(opts.model, weight_version=opts.weight_version, random_seed=opts.random_seed, device=opts.device,
                    dtype=opts.dtype, return_routed_experts=opts.enable_return_routed_experts)
    # uvicorn re-raises the signal that stopped it once it is done; by then there is nothing left to do.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    with torch_threads(opts.threads):
        asyncio.run(serve(engine, opts))
    print("cpu_server: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
