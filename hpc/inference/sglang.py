"""SGLang as a process: its launch command (pure), the wait until it is healthy, and a shell that runs it.

`launch_command(SGLangConfig(...))` is the command line; `ServerProcess` starts it in its own process
group with its output in a log file, waits until it answers, registers it in RUN/services, renews the
heartbeat with the weight version the server reports, and stops the whole group. `SGLangClient` is the
one HTTP client of a running server: health and model info for the launcher, and the control calls
(pause, update weights, flush, release memory) whoever publishes weights makes.

Checked against SGLang's own code, 0.5.12 (the version of containers/sglang.def) and 0.5.23, by
tests/test_sglang_contract.py (docs/train.md, "Which SGLang versions are tested"); first read in 0.5.12's
wheel (`pip download sglang==0.5.12 --no-deps`):
- sglang/srt/server_args.py `add_cli_args`: `--model-path` (alias `--model`), `--tensor-parallel-size`
  / `--tp-size`, `--data-parallel-size` / `--dp-size`, `--mem-fraction-static`, `--host` (default
  127.0.0.1), `--port` (30000), `--context-length`, `--tool-call-parser` and `--reasoning-parser`
  (choices: "auto" plus the names below), `--weight-version` (default "default"),
  `--skip-server-warmup` and `--enable-memory-saver` (store_true; the latter is what
  /release_memory_occupation needs). argparse keeps the last value of a repeated flag, so
  `extra_args`, appended last, win.
- Parser names: `FunctionCallParser.ToolCallParserEnum` (sglang/srt/function_call/
  function_call_parser.py) and `ReasoningParser.DetectorMap` (sglang/srt/parser/reasoning_parser.py);
  docs.sglang.io advanced_features/tool_parser and separate_reasoning list the same names.
- sglang/srt/entrypoints/http_server.py: GET /health answers 503 until the server has warmed up, then
  200; GET /model_info holds weight_version (/get_model_info still answers but logs a deprecation
  warning on every call, and /weight_version answers 404), so the heartbeat reads /model_info.
- sglang/launch_server.py: `python -m sglang.launch_server` still runs the server (with a warning
  that recommends `sglang serve`); the module form is what works through any interpreter.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..liveness import beat
from ..procs import kill_group
from ..registry import Registry, ServiceRecord
from ..sandbox.linux import die_with_parent
from .cpu_server import registry_weight_version

SGLANG_VERSION = "0.5.12"
TOOL_CALL_PARSERS = frozenset({
    "auto", "deepseekv3", "deepseekv31", "deepseekv32", "deepseekv4", "glm", "glm45", "glm47", "gpt-oss",
    "kimi_k2", "lfm2", "llama3", "mimo", "mistral", "poolside_v1", "pythonic", "qwen", "qwen25", "qwen3_coder",
    "step3", "step3p5", "minimax-m2", "trinity", "interns1", "hermes", "hunyuan", "gigachat3", "gemma4",
})
REASONING_PARSERS = frozenset({
    "auto", "deepseek-r1", "deepseek-v3", "deepseek-v4", "glm45", "hunyuan", "gpt-oss", "kimi", "kimi_k2", "mimo",
    "poolside_v1", "qwen3", "qwen3-thinking", "minimax", "minimax-append-think", "step3", "step3p5", "mistral",
    "nemotron_3", "interns1", "gemma4",
})
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class SGLangOptions(BaseModel):
    """How SGLang serves, whatever model it serves where: what a config sets (eval.sglang, and with the model
    and port the inference section); field names follow SGLang's flags."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    tp: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)
    mem_fraction_static: float = Field(default=0.85, gt=0, le=1)
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    context_length: int | None = Field(default=None, ge=1)
    skip_server_warmup: bool = False
    enable_memory_saver: bool = False       # colocated training: /release_memory_occupation needs it
    enable_return_routed_experts: bool = False   # an MoE model: each token's experts, for train.routing_replay
    python: str = "python3"                  # the interpreter of SGLang's environment (inside `container`, if any)
    container: Path | None = None            # an Apptainer image holding SGLang: `apptainer exec --nv IMAGE python`
    binds: list[str] = []                    # `apptainer exec --bind` specs: the model and run directories
    extra_args: list[str] = []               # any other SGLang flags; last, so they override the ones above

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_call_parser(cls, name: str | None) -> str | None:
        return _known(name, TOOL_CALL_PARSERS)

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, name: str | None) -> str | None:
        return _known(name, REASONING_PARSERS)


class SGLangConfig(SGLangOptions):
    """How to launch one SGLang server: its options, the model and where it listens."""

    model_path: Path
    host: str = "0.0.0.0"
    port: int = Field(default=30000, ge=1, le=65535)
    weight_version: str | None = None


def _known(name: str | None, names: frozenset[str]) -> str | None:
    if name is not None and name not in names:
        raise ValueError(f"{name!r} is not one of SGLang {SGLANG_VERSION}'s parsers: {', '.join(sorted(names))} "
                         "(a newer SGLang's name goes in extra_args)")
    return name


def launch_command(cfg: SGLangConfig) -> list[str]:
    """The command line that starts the server `cfg` describes."""
    prefix = [cfg.python]
    if cfg.container is not None:
        binds = ["--bind", ",".join(cfg.binds)] if cfg.binds else []
        prefix = ["apptainer", "exec", "--nv", *binds, str(cfg.container), cfg.python]
    args = ["-m", "sglang.launch_server", "--model-path", str(cfg.model_path),
            "--tp-size", str(cfg.tp), "--dp-size", str(cfg.dp),
            "--mem-fraction-static", str(cfg.mem_fraction_static),
            "--host", cfg.host, "--port", str(cfg.port)]
    optional = {"--tool-call-parser": cfg.tool_call_parser, "--reasoning-parser": cfg.reasoning_parser,
                "--context-length": cfg.context_length, "--weight-version": cfg.weight_version}
    for flag, value in optional.items():
        if value is not None:
            args += [flag, str(value)]
    switches = {"--skip-server-warmup": cfg.skip_server_warmup, "--enable-memory-saver": cfg.enable_memory_saver,
                "--enable-return-routed-experts": cfg.enable_return_routed_experts}
    args += [flag for flag, on in switches.items() if on]
    return [*prefix, *args, *cfg.extra_args]


def probe_host(host: str) -> str:
    """Where this node reaches a server that listens on `host`."""
    return "127.0.0.1" if host in WILDCARD_HOSTS else host


def advertised_host(host: str) -> str:
    """Where other nodes reach it: the registry's host."""
    return socket.gethostname() if host in WILDCARD_HOSTS else host


# -- talking to a running server --------------------------------------------------------------------------------

# The control calls' bodies, as SGLang's request types in sglang/srt/managers/io_struct.py take them
# (tests/test_sglang_contract.py builds those types from these dicts, in SGLang's own code).
PAUSE_BODY: dict[str, Any] = {}          # PauseGenerationReqInput: mode "abort", SGLang's default
CONTINUE_BODY: dict[str, Any] = {}       # ContinueGenerationReqInput


def update_weights_body(model_path: Path, version: int) -> dict[str, Any]:
    """UpdateWeightFromDiskReqInput: the checkpoint's HF export, and the version /model_info reports after."""
    return {"model_path": str(model_path), "weight_version": str(version)}


class SGLangError(RuntimeError):
    """A control call failed: the server did not answer, refused, or answered what proves nothing."""


class ServerUnreachable(SGLangError):
    """The server did not answer at all (refused or dropped the connection, timed out): it may be restarting."""


class SGLangClient:
    """One SGLang server's HTTP API, synchronous.

    The probes (`healthy`, `model_info`) answer False or None while the server is not up, since the
    launcher polls them; the control calls raise SGLangError naming the server, the path and the reply.
    """

    def __init__(self, url: str, timeout_s: float = 600.0, transport: httpx.BaseTransport | None = None):
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, transport=transport)

    # -- probes ------------------------------------------------------------------
    def healthy(self) -> bool:
        """GET /health answers 200 (SGLang answers 503 until it has warmed up)."""
        try:
            return self._http.get("/health").status_code == 200
        except httpx.HTTPError:
            return False    # not listening yet

    def model_info(self) -> dict[str, Any] | None:
        """GET /model_info; None unless it answers 200 with JSON."""
        try:
            r = self._model_info_reply()
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def _model_info_reply(self) -> httpx.Response:
        # SGLang 0.5.12 names it /model_info; older ones know only /get_model_info (0.5.12 still answers
        # that too, with a warning per call, so it is asked only after a 404).
        r = self._http.get("/model_info")
        return self._http.get("/get_model_info") if r.status_code == 404 else r

    # -- control calls -----------------------------------------------------------
    def _post(self, path: str, body: dict[str, Any] | None = None, *, json_reply: bool = False) -> dict[str, Any]:
        """POST; the reply's JSON. SGLang answers some calls in text (/flush_cache: "Cache flushed."): with
        json_reply, a 200 that is not JSON is an error (a proxy's page proves nothing), else it is {}."""
        try:
            r = self._http.post(path, json=body or {})
        except httpx.TransportError as e:
            raise ServerUnreachable(f"{self.url}{path}: {e!r}") from None
        except httpx.HTTPError as e:
            raise SGLangError(f"{self.url}{path}: {e!r}") from None
        if r.status_code != 200:
            raise SGLangError(f"{self.url}{path} answered {r.status_code}: {r.text[:300]}")
        try:
            return r.json() if r.content or json_reply else {}
        except ValueError:
            if json_reply:
                raise SGLangError(f"{self.url}{path} answered 200 with no JSON: {r.text[:300]!r}") from None
            return {}

    def pause(self) -> None:
        self._post("/pause_generation", PAUSE_BODY)

    def resume(self) -> None:
        self._post("/continue_generation", CONTINUE_BODY)

    def flush_cache(self) -> None:
        self._post("/flush_cache")

    def update_weights(self, model_path: Path, version: int) -> None:
        reply = self._post("/update_weights_from_disk", update_weights_body(model_path, version), json_reply=True)
        if reply.get("success") is False:
            raise SGLangError(f"{self.url} did not load {model_path}: {reply.get('message', reply)}")

    def weight_version(self) -> str | None:
        """The weight version the server reports, None if it reports none. Unlike model_info this raises
        SGLangError when the answer is not JSON: checking a reload, silence is a failure, not a version."""
        try:
            info = self._model_info_reply().json()
        except httpx.TransportError as e:
            raise ServerUnreachable(f"{self.url}/model_info: {e!r}") from None
        except (httpx.HTTPError, ValueError) as e:
            raise SGLangError(f"{self.url}/model_info: {e!r}") from None
        version = info.get("weight_version")
        return None if version is None else str(version)

    def release_memory(self) -> None:
        self._post("/release_memory_occupation")

    def resume_memory(self) -> None:
        self._post("/resume_memory_occupation")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SGLangClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- waiting for a server ---------------------------------------------------------------------------------------

class ServerError(RuntimeError):
    """The server exited, or did not become healthy in time; the message ends with its log's tail."""


def log_tail(path: Path | None, max_bytes: int = 4000) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def _with_log(message: str, log_path: Path | None) -> str:
    tail = log_tail(log_path).rstrip()
    return f"{message}; the end of {log_path}:\n{tail}" if tail else message


def wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen | None = None, *, log_path: Path | None = None,
                 poll_s: float = 0.25, cancelled: Callable[[], bool] = lambda: False) -> dict[str, Any] | None:
    """Poll /health, then /model_info, until both answer 200: the model info, or None once `cancelled()`.

    Raises ServerError, with the end of the log, as soon as `proc` exits or when timeout_s has passed.
    """
    deadline = time.monotonic() + timeout_s
    with SGLangClient(url, timeout_s=5.0) as client:
        while not cancelled():
            if proc is not None and proc.poll() is not None:
                raise ServerError(_with_log(f"the server at {url} exited with {proc.returncode} before it was "
                                            "healthy", log_path))
            if client.healthy() and (info := client.model_info()) is not None:
                return info
            if time.monotonic() > deadline:
                raise ServerError(_with_log(f"the server at {url} was not healthy after {timeout_s:.0f} s", log_path))
            time.sleep(poll_s)
    return None


# -- the process ------------------------------------------------------------------------------------------------

class ServerProcess:
    """A model server in its own process group: started, registered once healthy, heartbeat, stopped whole.

        with ServerProcess(command, port=p, log_path=..., registry=reg, index=i) as server:
            server.start()       # returns once healthy and registered (False if request_stop() came first)
            server.serve()       # heartbeats until request_stop() (returns) or the server exits (ServerError)

    `request_stop()` only sets a flag, so a signal handler may call it.
    """

    def __init__(self, command: Sequence[str], *, port: int, log_path: Path, host: str = "0.0.0.0",
                 registry: Registry | None = None, role: str = "inference", index: int = 0,
                 env: Mapping[str, str] | None = None, heartbeat_s: float = 5.0, health_timeout_s: float = 1800.0,
                 grace_s: float = 30.0, poll_s: float = 0.25, liveness_file: Path | None = None):
        self.command, self.port, self.host, self.log_path = list(command), port, host, Path(log_path)
        self.url = f"http://{probe_host(host)}:{port}"
        self.registry, self.role, self.index = registry, role, index
        self.env = dict(os.environ if env is None else env)
        self.heartbeat_s, self.health_timeout_s = heartbeat_s, health_timeout_s
        self.grace_s, self.poll_s = grace_s, poll_s
        self.liveness_file = liveness_file       # touched while the server answers (hpc.liveness)
        self.proc: subprocess.Popen | None = None
        self.record: ServiceRecord | None = None
        self.stop_requested = False
        self._stopped = False

    @classmethod
    def of(cls, cfg: SGLangConfig, log_path: Path, **options: Any) -> ServerProcess:
        """The server `cfg` describes (the one way the inference role and eval start SGLang)."""
        return cls(launch_command(cfg), host=cfg.host, port=cfg.port, log_path=log_path, **options)

    def request_stop(self) -> None:
        self.stop_requested = True

    def start(self) -> bool:
        """Start the server and wait until it is healthy, then register it; False if asked to stop meanwhile."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(self.command)}\n".encode())
            log.flush()
            # Its own session and process group: stop() takes SGLang's scheduler and detokenizer processes too.
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True, preexec_fn=_die_with_parent)
        def cancelled() -> bool:
            beat(self.liveness_file)     # loading the model is not hanging: health_timeout_s bounds it
            return self.stop_requested
        info = wait_healthy(self.url, self.health_timeout_s, self.proc, log_path=self.log_path, poll_s=self.poll_s,
                            cancelled=cancelled)
        if info is None:
            return False
        if self.registry is not None:
            self.record = self.registry.register(self.role, self.index, host=advertised_host(self.host),
                                                 port=self.port, weight_version=_version(info))
        return True

    def heartbeat(self, client: SGLangClient) -> bool:
        """Renew the registry record with the version the server reports; False (no renewal) if it did not answer."""
        info = client.model_info()
        if info is None:
            return False   # a server that does not answer must not look alive
        if self.registry is not None and self.record is not None:
            self.record = self.registry.heartbeat(self.record, weight_version=_version(info))
        beat(self.liveness_file)
        return True

    def serve(self) -> None:
        """Heartbeat until request_stop(); raises ServerError if the server exits first."""
        if self.proc is None:
            raise RuntimeError("serve() before start()")
        beat = time.monotonic()
        with SGLangClient(self.url, timeout_s=10.0) as client:
            while not self.stop_requested:
                if self.proc.poll() is not None:
                    raise ServerError(_with_log(f"the server at {self.url} exited with {self.proc.returncode}",
                                                self.log_path))
                if time.monotonic() - beat >= self.heartbeat_s:
                    self.heartbeat(client)
                    beat = time.monotonic()
                time.sleep(self.poll_s)

    def stop(self) -> None:
        """Deregister (no new requests), then SIGTERM the group, wait grace_s, SIGKILL what is left."""
        if self.registry is not None and self.record is not None:
            self.registry.deregister(self.record)
            self.record = None
        if self.proc is None or self._stopped:
            return     # once reaped, the group's id may belong to someone else: signal it once only
        self._stopped = True
        deadline = time.monotonic() + self.grace_s
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(self.grace_s)
        except subprocess.TimeoutExpired:
            pass
        # The rest of the group (what the leader started) gets what is left of the grace; the leader is reaped
        # first, since an unreaped leader would keep the group alive in kill_group's eyes.
        kill_group(self.proc.pid, grace_s=max(0.0, deadline - time.monotonic()))
        self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    # In its own session the server misses the signals meant for this process: should this process be
    # SIGKILLed (Slurm's KillWait), its leader goes too rather than hold the GPUs (Linux only).
    try:
        die_with_parent(signal.SIGKILL)
    except OSError:
        pass


def _version(info: dict[str, Any]) -> int | None:
    version = info.get("weight_version")
    return None if version is None else registry_weight_version(str(version))
