"""SGLang's /generate, as pure functions: the request, one sampling step, the finish check, the reply's parts.

Mirrors SGLang 0.5 (sgl-project/sglang: sampling/sampling_params.py, layers/sampler.py,
managers/schedule_batch.py Req.check_finished, managers/detokenizer_manager.py trim_matched_stop):
- `sampling_params` are SGLang's SamplingParams with its defaults. The seed is `sampling_seed`:
  SGLang has no `seed`, and an unknown key fails there too. Temperature 0 becomes top_k 1 at
  temperature 1, as SGLang normalizes it.
- The reported logprob, with SGLANG_RETURN_ORIGINAL_LOGPROB unset: greedy (top_k 1) reports
  log_softmax(logits), which is what SGLang's all-greedy batch path does; sampling reports
  log_softmax(logits / temperature), taken before top-k/top-p/min-p truncation (SGLang's
  `torch.log(probs)` of the temperature-scaled softmax). With the variable set, SGLang reports
  log_softmax(logits) always (`original_logprob=True`). So a trainer recomputing the behaviour
  policy divides by the same temperature, and the reported logprob is exactly the sampled
  distribution's only with top_p 1, top_k -1 and min_p 0.
- Sampling is SGLang's pytorch backend: softmax(logits / T) sorted; top_k; top_p against the mass
  before each token; min_p against the top probability; multinomial over what is left.
- Length is checked before stop tokens; stop tokens are the request's plus the model's EOS ids,
  unless ignore_eos. A matched stop token stays in output_ids and logprobs; `text` drops it.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from dataclasses import dataclass
from typing import Any

DEFAULT_SAMPLING = {  # SGLang's SamplingParams and its defaults
    "max_new_tokens": 128, "stop": None, "stop_token_ids": None, "stop_regex": None, "temperature": 1.0,
    "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1, "json_schema": None, "regex": None, "ebnf": None,
    "structural_tag": None, "ignore_eos": False, "skip_special_tokens": True, "spaces_between_special_tokens": True,
    "no_stop_trim": False, "custom_params": None, "stream_interval": None, "logit_bias": None, "sampling_seed": None,
}
IMPLEMENTED = {"max_new_tokens", "stop_token_ids", "temperature", "top_p", "top_k", "min_p", "ignore_eos",
               "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval",
               "sampling_seed"}
SAMPLING_EPS = 1e-6


class RequestError(ValueError):
    """A request SGLang would refuse (or that this stand-in does not mirror): answered with 400."""


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int            # 0: the whole vocabulary
    min_p: float
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    skip_special_tokens: bool
    no_stop_trim: bool
    seed: int | None

    @property
    def greedy(self) -> bool:
        return self.top_k == 1


@dataclass(frozen=True)
class GenerateRequest:
    input_ids: tuple[int, ...]
    sampling: Sampling
    return_logprob: bool
    rid: str | None
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0      # the first position whose experts the reply carries


def parse_sampling(raw: Any) -> Sampling:
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise RequestError("sampling_params must be an object")
    unknown = sorted(set(raw) - set(DEFAULT_SAMPLING))
    if unknown:
        hint = " (SGLang's seed is sampling_seed)" if "seed" in unknown else ""
        raise RequestError(f"unknown sampling parameters {unknown}{hint}")
    unsupported = sorted(k for k, v in raw.items() if k not in IMPLEMENTED and v not in (DEFAULT_SAMPLING[k], []))
    if unsupported:
        raise RequestError(f"the CPU stand-in does not implement {unsupported}; leave them at SGLang's defaults")
    p = {**DEFAULT_SAMPLING, **{k: v for k, v in raw.items() if v is not None}}
    number = (int, float)
    checks = [("max_new_tokens", isinstance(p["max_new_tokens"], int) and p["max_new_tokens"] >= 0, "an int >= 0"),
              ("temperature", isinstance(p["temperature"], number) and p["temperature"] >= 0, "non-negative"),
              ("top_p", isinstance(p["top_p"], number) and 0 < p["top_p"] <= 1, "in (0, 1]"),
              ("top_k", isinstance(p["top_k"], int) and (p["top_k"] == -1 or p["top_k"] >= 1), "-1 or >= 1"),
              ("min_p", isinstance(p["min_p"], number) and 0 <= p["min_p"] <= 1, "in [0, 1]"),
              ("stop_token_ids", isinstance(p["stop_token_ids"] or [], list)
               and all(isinstance(t, int) for t in p["stop_token_ids"] or []), "a list of token ids"),
              ("sampling_seed", p["sampling_seed"] is None or isinstance(p["sampling_seed"], int)
               and -2**63 <= p["sampling_seed"] < 2**63, "an int64")]
    for name, ok, want in checks:
        if not ok or isinstance(p[name], bool):
            raise RequestError(f"{name} must be {want}, got {p[name]!r}")
    temperature, top_k = float(p["temperature"]), p["top_k"]
    if temperature < SAMPLING_EPS:    # SGLang: temperature 0 is top_k 1 at temperature 1
        temperature, top_k = 1.0, 1
    return Sampling(p["max_new_tokens"], temperature, float(p["top_p"]), 0 if top_k == -1 else top_k,
                    float(p["min_p"]), frozenset(p["stop_token_ids"] or ()), bool(p["ignore_eos"]),
                    bool(p["skip_special_tokens"]), bool(p["no_stop_trim"]), p["sampling_seed"])


def parse_generate(body: Any, *, vocab_size: int, context_len: int) -> GenerateRequest:
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    if body.get("stream") or body.get("text") is not None or body.get("top_logprobs_num"):
        raise RequestError("the CPU stand-in takes input_ids only, without streaming or top logprobs")
    ids = body.get("input_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise RequestError("input_ids must be one non-empty list of token ids (batches are not mirrored)")
    if not all(0 <= t < vocab_size for t in ids):
        raise RequestError(f"input_ids holds token ids outside the vocabulary [0, {vocab_size})")
    if len(ids) >= context_len:
        raise RequestError(f"The input ({len(ids)} tokens) is longer than the model's context length "
                           f"({context_len} tokens).")
    sampling = parse_sampling(body.get("sampling_params"))
    if len(ids) + sampling.max_new_tokens > context_len:
        raise RequestError(f"Requested token count exceeds the model's maximum context length of {context_len} "
                           f"tokens: {len(ids)} in the input and {sampling.max_new_tokens} new")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise RequestError("rid must be a string")
    start = body.get("routed_experts_start_len", 0)
    if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start <= len(ids):
        raise RequestError(f"routed_experts_start_len must be in [0, {len(ids)}] (the prompt's tokens), got {start!r}")
    return GenerateRequest(tuple(ids), sampling, bool(body.get("return_logprob")), rid,
                           bool(body.get("return_routed_experts")), start)


def choose_token(logits, sampling: Sampling, generator, *, original_logprob: bool = False) -> tuple[int, float]:
    """The next token and the logprob SGLang reports for it (see the module docstring)."""
    import torch

    logits = logits.float()
    raw = torch.log_softmax(logits, dim=-1)
    if sampling.greedy:
        token = int(torch.argmax(logits))
        return token, float(raw[token])
    scaled = torch.log_softmax(logits / sampling.temperature, dim=-1)
    probs_sort, probs_idx = scaled.exp().sort(descending=True)
    before = torch.cumsum(probs_sort, dim=-1) - probs_sort
    if sampling.top_k:
        probs_sort[sampling.top_k:] = 0.0
    probs_sort[before > sampling.top_p] = 0.0
    if sampling.min_p > 0:
        probs_sort[probs_sort < probs_sort[0] * sampling.min_p] = 0.0
    token = int(probs_idx[torch.multinomial(probs_sort, 1, generator=generator)])
    return token, float((raw if original_logprob else scaled)[token])


def finish_reason(output_ids: list[int], sampling: Sampling, eos_ids: frozenset[int]) -> dict[str, Any] | None:
    """SGLang's Req.check_finished: the length limit first, then stop tokens."""
    if len(output_ids) >= sampling.max_new_tokens:
        return {"type": "length", "length": sampling.max_new_tokens}
    if output_ids and not sampling.ignore_eos and output_ids[-1] in sampling.stop_token_ids | eos_ids:
        return {"type": "stop", "matched": output_ids[-1]}
    return None


def abort_reason() -> dict[str, Any]:
    return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def text_ids(output_ids: list[int], finish: dict[str, Any], sampling: Sampling) -> list[int]:
    """What `text` decodes: SGLang's detokenizer drops a matched stop token (trim_matched_stop)."""
    # SGLang tests `if not matched`, so a matched token id 0 stays; mirrored rather than fixed.
    if sampling.no_stop_trim or not finish.get("matched") or not isinstance(finish["matched"], int):
        return output_ids
    return output_ids[:-1]


def request_seed(request: GenerateRequest, server_seed: int, fallback: random.Random) -> int:
    if request.sampling.seed is not None:
        return request.sampling.seed % 2**64      # torch takes seeds as uint64
    if request.rid is not None:
        return int.from_bytes(hashlib.sha256(f"{server_seed}:{request.rid}".encode()).digest()[:8], "little")
    return fallback.getrandbits(63)


def generate_reply(request: GenerateRequest, output_ids: list[int], logprobs: list[float], finish: dict[str, Any],
                   *, text: str, weight_version: str, routed_experts: str | None = None) -> dict[str, Any]:
    """The reply's body; `routed_experts` (hpc.inference.routing.encode of positions [start, seqlen - 1))
    where the request asked for them."""
    meta: dict[str, Any] = {"id": request.rid or uuid.uuid4().hex, "finish_reason": finish,
                            "prompt_tokens": len(request.input_ids), "completion_tokens": len(output_ids),
                            "cached_tokens": 0, "weight_version": weight_version}
    if request.return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, output_ids, strict=True)]
    if routed_experts is not None:
        meta["routed_experts"] = routed_experts
    return {"text": text, "output_ids": output_ids, "meta_info": meta}
