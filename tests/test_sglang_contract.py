"""SGLang's own code judges what the toolkit sends it and reads from it, for the pinned and the newest SGLang.

No GPU needed: tests/sglang_env.py installs each version's wheel (and its pinned transformers) from the
package index under .cache/sglang-contract, and tests/sglang_oracle.py, in a subprocess per version, runs
SGLang's argument parser, ServerArgs' post-init checks, its request types and reply builders on what the
toolkit's code produced here (launch_command, SGLangClient's calls and the adapter's /generate, recorded at the
HTTP transport). The same requests then go to the CPU stand-in, whose answers must have SGLang's shapes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sglang_env import VERSIONS, environment_or_skip

from agentrl.adapter.limits import SAMPLING_KEYS, sampling_values
from agentrl.adapter.upstream import UpstreamPool, parse_generation
from hpc.inference import routing
from hpc.inference.cpu_server import Engine, ServerThread
from hpc.inference.sglang import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    SGLangClient,
    SGLangConfig,
    SGLangError,
    launch_command,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
ORACLE = Path(__file__).resolve().parent / "sglang_oracle.py"
PROMPT = [101, 202, 303, 404, 505, 606]
ROUTES_FROM = 4
# Every sampling key the adapter passes on (limits.SAMPLING_KEYS), at values the CPU stand-in implements
SAMPLING = {"max_new_tokens": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "stop": [],
            "sampling_seed": 3, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0}
# SGLangConfig's fields that become flags, and the ServerArgs field each flag must set
FIELD_OF = {"model_path": "model_path", "tp": "tp_size", "dp": "dp_size", "mem_fraction_static": "mem_fraction_static",
            "tool_call_parser": "tool_call_parser", "reasoning_parser": "reasoning_parser",
            "context_length": "context_length", "host": "host", "port": "port", "weight_version": "weight_version",
            "skip_server_warmup": "skip_server_warmup", "enable_memory_saver": "enable_memory_saver",
            "enable_return_routed_experts": "enable_return_routed_experts"}
NOT_FLAGS = {"python", "container", "binds", "extra_args"}   # how the command starts, or passed through as given
SGLANG_DEFAULTS = {"weight_version": "default"}              # an option left unset leaves SGLang's default
# An HF config SGLang's post-init reads (no weights needed): a small Llama
MODEL_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
                "vocab_size": 1024, "max_position_embeddings": 8192}


def configs(model: Path) -> dict[str, SGLangConfig]:
    """The launches the toolkit supports: the defaults, every option set, and a colocated loopback server."""
    return {
        "defaults": SGLangConfig(model_path=model),
        "every option": SGLangConfig(model_path=model, tp=4, dp=2, mem_fraction_static=0.7,
                                     tool_call_parser="qwen3_coder", reasoning_parser="qwen3", context_length=4096,
                                     host="10.0.0.5", port=31000, weight_version="12", skip_server_warmup=True,
                                     enable_memory_saver=True, enable_return_routed_experts=True),
        "colocated": SGLangConfig(model_path=model, tp=8, mem_fraction_static=0.3, host="127.0.0.1", port=30001,
                                  enable_memory_saver=True, tool_call_parser="auto", reasoning_parser="auto"),
    }


def expected_fields(cfg: SGLangConfig) -> dict[str, Any]:
    values = {FIELD_OF[f]: getattr(cfg, f) for f in FIELD_OF}
    return {k: str(v) if isinstance(v, Path) else SGLANG_DEFAULTS.get(k) if v is None and k in SGLANG_DEFAULTS
            else v for k, v in values.items()}


# -- what the toolkit sends, recorded at the transport -----------------------------------------------------------

class Recorder:
    """A fake SGLang at the HTTP transport: records each request and answers as SGLang would have."""

    def __init__(self, replies: dict[str, Any] | None = None):
        self.sent: list[tuple[str, str, Any]] = []
        self.replies = replies or {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.sent.append((request.method, request.url.path, body))
        reply = self.replies.get(request.url.path, {"success": True, "weight_version": "7"})
        return httpx.Response(200, json=reply)


def toolkit_requests(model: Path, replies: dict[str, Any] | None = None) -> list[tuple[str, str, Any]]:
    """Every request the toolkit makes of a server, in the order a weight publish makes them."""
    record = Recorder(replies)
    client = SGLangClient("http://gpu1:30000", transport=httpx.MockTransport(record))
    client.healthy()
    client.model_info()
    client.pause()
    client.update_weights(model, 7)
    client.flush_cache()
    client.resume()
    client.weight_version()
    client.release_memory()
    client.resume_memory()

    async def generate() -> None:
        pool = UpstreamPool(["http://gpu1:30000"], transport=httpx.MockTransport(record))
        try:
            await pool.generate("http://gpu1:30000", PROMPT, SAMPLING)
        except Exception:  # noqa: BLE001 - the recorder's reply is not a generation; the request is what counts
            pass
        try:        # an MoE's turn for routing replay: its experts from a position of the prompt on
            await pool.generate("http://gpu1:30000", PROMPT, SAMPLING, routes_from=ROUTES_FROM)
        except Exception:  # noqa: BLE001
            pass
        await pool.aclose()
    asyncio.run(generate())
    return record.sent


# -- SGLang's answers --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_config_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("llama-config")
    (d / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return d


@pytest.fixture(scope="module")
def sent(tiny_model) -> list[tuple[str, str, Any]]:
    return toolkit_requests(tiny_model)


@pytest.fixture(scope="module")
def answers(model_config_dir, sent, tmp_path_factory) -> dict[str, dict[str, Any]]:
    """Per version, SGLang's answers; the versions' oracles run at once (each is ~10 s of imports)."""
    envs = {v: environment_or_skip(v, ROOT / ".cache" / "sglang-contract") for v in VERSIONS}
    questions = json.dumps({
        "fields": sorted(FIELD_OF.values()),
        "argvs": [launch_command(cfg)[3:] for cfg in configs(model_config_dir).values()],
        "requests": [{"path": path, "body": body} for method, path, body in sent if method == "POST"],
        "vocab_size": MODEL_CONFIG["vocab_size"],
    })
    out = tmp_path_factory.mktemp("sglang-answers")
    procs = {v: subprocess.Popen([sys.executable, str(ORACLE), str(env), str(out / f"{v}.json")],
                                 stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for v, env in envs.items()}
    result = {}
    for v, proc in procs.items():
        _, err = proc.communicate(questions, timeout=300)
        assert proc.returncode == 0, f"SGLang {v}'s oracle failed:\n{err[-3000:]}"
        result[v] = json.loads((out / f"{v}.json").read_text())
    return result


@pytest.fixture(params=VERSIONS)
def sglang(request, answers) -> dict[str, Any]:
    found = answers[request.param]
    assert found["version"] == request.param and ".cache/sglang-contract" in found["file"]
    return found


# -- the launch ---------------------------------------------------------------------------------------------------

def test_every_flag_the_toolkit_renders_is_covered_here():
    assert set(SGLangConfig.model_fields) == set(FIELD_OF) | NOT_FLAGS


def test_sglang_parses_every_launch_into_the_fields_meant(sglang, model_config_dir):
    for (name, cfg), found in zip(configs(model_config_dir).items(), sglang["launch"], strict=True):
        assert launch_command(cfg)[:3] == ["python3", "-m", "sglang.launch_server"]
        assert "error" not in found, f"{name}: SGLang {sglang['version']} refuses {launch_command(cfg)}: {found}"
        assert found["fields"] == expected_fields(cfg), name
        # post-init's checks: all of them with --device cpu; as rendered, up to the accelerator probe at most
        assert found["post_init_cpu"] == "ok", name
        assert found["post_init"] == "ok" or "No accelerator" in found["post_init"], name


def test_sglang_knows_every_parser_name_the_toolkit_accepts(sglang):
    # "auto" is a choice of the flags, not a parser (the colocated launch above passes it)
    assert TOOL_CALL_PARSERS - {"auto"} <= set(sglang["parsers"]["tool_call"])
    assert REASONING_PARSERS - {"auto"} <= set(sglang["parsers"]["reasoning"])


# -- the requests -------------------------------------------------------------------------------------------------

def test_sglang_serves_every_route_the_toolkit_calls(sglang, sent):
    for method, path, _ in sent:
        assert method in sglang["routes"].get(path, {}).get("methods", []), f"{method} {path}"


def test_sglang_takes_every_body_the_toolkit_sends(sglang, sent):
    posts = [(path, body) for method, path, body in sent if method == "POST"]
    for (path, body), found in zip(posts, sglang["requests"], strict=True):
        if found["type"] is None:          # a route without a body type (/flush_cache): nothing may be sent
            assert not body, path
            continue
        assert "error" not in found, f"SGLang {sglang['version']} refuses {path} {body}: {found['error']}"
        assert found["values"] == body, path
        assert found.get("contract_error") is None, path
    by_path = dict(zip([p for p, _ in posts], sglang["requests"], strict=True))
    held = by_path["/generate"]["sampling"]
    assert held == {k: held[k] if held[k] == "<held under another name>" else v for k, v in SAMPLING.items()}
    assert sum(v == "<held under another name>" for v in held.values()) <= 1      # stop, as stop_strs
    assert by_path["/pause_generation"]["defaults"]["mode"] == "abort"     # what the publish relies on


def test_the_sampling_keys_are_the_adapters():
    assert set(SAMPLING) == set(SAMPLING_KEYS) and sampling_values(SAMPLING) == SAMPLING


# -- the replies --------------------------------------------------------------------------------------------------

def sglang_reply(sglang: dict[str, Any], finish: str) -> dict[str, Any]:
    """A /generate reply with the keys SGLang's tokenizer manager writes, the values from its own functions."""
    meta = {"id": "r1", "finish_reason": sglang["finish_reasons"][finish], "weight_version": "7",
            "output_token_logprobs": sglang["output_token_logprobs"]}
    reply = {"text": "", "output_ids": [7, 9], "meta_info": meta}
    assert set(meta) <= set(sglang["written"]["meta_info"]) and set(reply) <= set(sglang["written"]["reply"])
    return reply


@pytest.mark.parametrize("finish, kind, matched", [("length", "length", None), ("stop", "stop", 7),
                                                   ("abort", "abort", None)])
def test_the_adapter_reads_sglangs_generate_reply(sglang, finish, kind, matched):
    gen = parse_generation(sglang_reply(sglang, finish))
    assert (gen.output_ids, gen.logprobs) == ([7, 9], [-0.5, -1.25])
    assert (gen.finish_reason, gen.matched_stop, gen.weight_version) == (kind, matched, "7")


def test_the_client_reads_sglangs_control_replies(sglang, tiny_model):
    refused = {"success": False, "message": "no such checkpoint", "num_paused_requests": 0}
    info = {"weight_version": "7", "model_path": "/m"}
    assert set(refused) <= set(sglang["routes"]["/update_weights_from_disk"]["keys"])
    assert set(info) <= set(sglang["routes"]["/model_info"]["keys"])
    client = SGLangClient("http://gpu1:30000", transport=httpx.MockTransport(
        Recorder({"/update_weights_from_disk": refused, "/model_info": info})))
    assert client.weight_version() == "7"
    with pytest.raises(SGLangError, match="no such checkpoint"):
        client.update_weights(tiny_model, 7)


# -- the CPU stand-in, with the same requests ---------------------------------------------------------------------

GPU_ONLY = {"/release_memory_occupation", "/resume_memory_occupation"}   # colocated: SGLang's memory saver


def test_the_cpu_stand_in_answers_the_same_requests_in_sglangs_shapes(answers, sent, tiny_model, tiny_moe_model):
    replies: dict[str, Any] = {}
    with ServerThread(Engine(tiny_model)) as server, \
            ServerThread(Engine(tiny_moe_model, return_routed_experts=True)) as moe:
        for method, path, body in sent:
            if path in GPU_ONLY:
                continue
            routed = bool(body and body.get("return_routed_experts"))     # an MoE's turn: the MoE's server
            r = httpx.request(method, (moe if routed else server).url + path, json=body, timeout=60)
            assert r.status_code == 200, f"{method} {path} {body}: {r.status_code} {r.text[:300]}"
            replies[f"{path} (routed)" if routed else path] = (
                r.json() if r.headers.get("content-type") == "application/json" else r.text)
    gen = parse_generation(replies["/generate"])
    assert len(gen.output_ids) == SAMPLING["max_new_tokens"] and gen.weight_version == "7"
    assert gen.routed_experts is None
    routed = parse_generation(replies["/generate (routed)"])
    rows = len(PROMPT) + len(routed.output_ids) - 1 - ROUTES_FROM       # positions [start, seqlen - 1)
    assert routed.routed_experts is not None
    assert routing.decode(routed.routed_experts, rows=rows).shape == (rows, 4)        # 2 layers x 2 experts
    for sglang in answers.values():
        assert "routed_experts" in sglang["written"]["meta_info"], sglang["version"]
        for reply in (replies["/generate"], replies["/generate (routed)"]):
            assert set(reply) <= set(sglang["written"]["reply"]), sglang["version"]
            assert set(reply["meta_info"]) <= set(sglang["written"]["meta_info"]), sglang["version"]
        reply = replies["/generate"]
        finish = reply["meta_info"]["finish_reason"]
        assert finish.keys() == sglang["finish_reasons"][finish["type"]].keys()
        for path in ("/update_weights_from_disk", "/model_info"):
            assert set(replies[path]) <= set(sglang["routes"][path]["keys"]), (sglang["version"], path)

