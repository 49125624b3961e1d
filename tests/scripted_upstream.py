"""A scripted stand-in for SGLang's HTTP server: each `POST /generate` answers the next step of a script.

A step is an assistant message in chat-template form; its output ids are what the tiny model would emit
for it, `encode(assistant_text(message)) + [<|im_end|>]`. A step may also be a callable(request) -> step,
`{"fail": status}` (answer that HTTP status), and may carry `"delay_s": x` (sleep first).

The reply mirrors SGLang 0.5, as read in sgl-project/sglang's source (tokenizer_manager._handle_batch_output,
detokenizer_manager.trim_matched_stop, schedule_batch.Req.check_finished):
- `meta_info` holds `id` (the request's rid, else a fresh hex id), `finish_reason`, `prompt_tokens`,
  `completion_tokens`, `cached_tokens`, `weight_version` ("default" unless set) and, with return_logprob,
  `output_token_logprobs` as [logprob, token_id, null] (the text slot is null unless return_text_in_logprobs).
- A matched stop token stays in `output_ids`, `output_token_logprobs` and `completion_tokens`; only `text`
  drops it, and `text` is decoded with skip_special_tokens (SGLang's default).
- `finish_reason` is {"type": "stop", "matched": <token id>} or {"type": "length", "length": max_new_tokens}.
  Length is checked before stop tokens, so a stop token sampled as the max_new_tokens-th token ends the
  output yet the reason is "length".
- max_new_tokens defaults to 128. Errors answer {"error": {"message": ...}}.
Not mirrored: streaming (refused with 400), batched input, input-side and top logprobs, timing fields.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from agentrl.models.tiny import EOS_TOKEN, assistant_text

Step = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default


def logprob(position: int, token_id: int) -> float:
    """The scripted logprob of token_id at output position `position`, for tests to recompute."""
    return -(((token_id + 7 * position) % 97) + 1) / 100.0


def assert_one_exact_sample(result: dict[str, Any], sampled: list[list[int]]) -> None:
    """A finish_session reply is one clean chain training exactly the `sampled` ids of each step, with the
    scripted logprobs."""
    assert len(result["samples"]) == 1, result["stats"]
    s = result["samples"][0]
    response = s["tokens"][s["prompt_length"]:]
    trained = [(t, lp) for t, m, lp in zip(response, s["loss_mask"], s["rollout_log_probs"], strict=True) if m]
    assert s["trained_tokens"] == sum(map(len, sampled))
    assert trained == [(t, logprob(i, t)) for ids in sampled for i, t in enumerate(ids)]
    assert result["stats"]["drift"] == {"root": 1, "clean": len(sampled) - 1, "realign": 0, "fork": 0}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


class ScriptedUpstream:
    """`with ScriptedUpstream(model_dir, steps) as upstream:` serves on `upstream.url` until the block ends.

    `requests` records every /generate body in arrival order; `push()` appends steps, also while serving.
    """

    def __init__(self, model_dir: Path, script: Iterable[Step] = (), *, weight_version: str = "default"):
        from transformers import AutoTokenizer

        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.stop_id = self.tokenizer.convert_tokens_to_ids(EOS_TOKEN)
        self.script: deque[Step] = deque(script)
        self.weight_version = weight_version
        self.requests: list[dict[str, Any]] = []
        # the calls whose step ran to its answer (after its delay): a test orders events by it, not by the clock
        self.answered: list[int] = []
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def push(self, *steps: Step) -> None:
        self.script.extend(steps)

    def output_ids(self, message: dict[str, Any]) -> list[int]:
        """The ids a model emits for this assistant message, the stop token included."""
        return self.tokenizer.encode(assistant_text(message), add_special_tokens=False) + [self.stop_id]

    def reply(self, body: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        """SGLang's /generate reply for a request whose sampled output is `message`."""
        sampling = body.get("sampling_params") or {}
        max_new_tokens = sampling.get("max_new_tokens")
        max_new_tokens = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
        ids = self.output_ids(message)
        if len(ids) >= max_new_tokens:
            ids = ids[:max_new_tokens]
            finish, text_ids = {"type": "length", "length": max_new_tokens}, ids
        else:
            finish, text_ids = {"type": "stop", "matched": self.stop_id}, ids[:-1]
        meta = {"id": body.get("rid") or uuid.uuid4().hex, "finish_reason": finish,
                "prompt_tokens": len(body["input_ids"]), "completion_tokens": len(ids), "cached_tokens": 0,
                "weight_version": self.weight_version}
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[logprob(i, t), t, None] for i, t in enumerate(ids)]
        return {"text": self.tokenizer.decode(text_ids, skip_special_tokens=True), "output_ids": ids,
                "meta_info": meta}

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

        @app.get("/get_model_info")
        async def model_info() -> dict[str, Any]:
            return {"model_path": str(self.model_dir), "tokenizer_path": str(self.model_dir),
                    "is_generation": True, "weight_version": self.weight_version}

        @app.post("/generate")
        async def generate(request: Request) -> Response:
            body = await request.json()
            self.requests.append(body)
            call = len(self.requests)
            if body.get("stream"):
                return _error(400, f"call {call}: the scripted upstream does not stream")
            if not isinstance(body.get("input_ids"), list):
                return _error(400, f"call {call}: only single requests with input_ids are scripted")
            if not self.script:
                return _error(500, f"script exhausted: /generate call {call} has no step "
                                   f"({call - 1} were scripted)")
            step = self.script.popleft()
            try:
                if callable(step):
                    step = step(body)
                step = dict(step)
                delay_s = step.pop("delay_s", 0)
                if delay_s:
                    await asyncio.sleep(delay_s)
                self.answered.append(call)
                if "fail" in step:
                    return _error(step["fail"], f"scripted failure of /generate call {call}")
                return JSONResponse(self.reply(body, step))
            except Exception as e:  # a broken step must name its call, not surface as a bare 500
                return _error(500, f"/generate call {call}: bad script step {step!r}: {e!r}")

        return app

    def __enter__(self) -> ScriptedUpstream:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        # A short graceful shutdown, so that a delayed step still in flight cannot hold up the test.
        config = uvicorn.Config(self.app(), log_level="warning", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the scripted upstream failed to start")
            self._thread.join(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            raise RuntimeError("the scripted upstream did not stop within 10 s")
