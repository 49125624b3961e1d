"""The CPU stand-in for SGLang: /generate's logic, its logprobs against a forward pass, concurrency, pause and
continue, weight updates, and the command with its registry record."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import torch
from scripted_upstream import ScriptedUpstream
from waiting import wait_until

from agentrl.adapter.upstream import parse_generation
from hpc.inference.cpu_server import Engine, ServerThread
from hpc.inference.generation import (
    GenerateRequest,
    RequestError,
    choose_token,
    finish_reason,
    parse_generate,
    parse_sampling,
    request_seed,
    text_ids,
)
from hpc.registry import Registry
from hpc.runlayout import RunLayout

pytestmark = pytest.mark.integration

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [101, 202, 303, 404, 505, 606]


# -- the pure parts -------------------------------------------------------------------------------------------

def test_sampling_params_follow_sglang():
    plain = parse_sampling(None)
    assert (plain.max_new_tokens, plain.temperature, plain.top_p, plain.top_k) == (128, 1.0, 1.0, 0)
    assert not plain.greedy
    greedy = parse_sampling({"temperature": 0, "top_k": 50})
    assert (greedy.greedy, greedy.temperature, greedy.top_k) == (True, 1.0, 1)   # SGLang's normalization
    assert parse_sampling({"repetition_penalty": 1.0, "stop": [], "n": 1}).top_k == 0   # defaults are fine
    with pytest.raises(RequestError, match=r"unknown sampling parameters \['seed'\] \(SGLang's seed is sampling_seed"):
        parse_sampling({"seed": 1})
    with pytest.raises(RequestError, match=r"does not implement \['repetition_penalty', 'stop'\]"):
        parse_sampling({"repetition_penalty": 1.1, "stop": ["\n"]})


@pytest.mark.parametrize("params, match", [
    ({"temperature": -1}, "temperature must be non-negative"), ({"top_p": 0}, r"top_p must be in \(0, 1\]"),
    ({"top_k": 0}, "top_k must be -1 or >= 1"), ({"min_p": 2}, "min_p"), ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": True}, "max_new_tokens"), ({"stop_token_ids": [1.5]}, "stop_token_ids"),
    ({"sampling_seed": "x"}, "sampling_seed"), ({"sampling_seed": 2**63}, "sampling_seed must be an int64"),
])
def test_bad_sampling_params_are_refused(params, match):
    with pytest.raises(RequestError, match=match):
        parse_sampling(params)


@pytest.mark.parametrize("body, match", [
    ([], "JSON object"), ({"text": "hi"}, "input_ids only"), ({"input_ids": [[1, 2]]}, "one non-empty list"),
    ({"input_ids": [1, 4000]}, r"outside the vocabulary \[0, 4000\)"), ({"input_ids": [1], "stream": True}, "stream"),
    ({"input_ids": list(range(10))}, r"\(10 tokens\) is longer than the model's context length \(10 tokens\)"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 9}}, "exceeds the model's maximum context length"),
])
def test_bad_generate_requests_are_refused(body, match):
    with pytest.raises(RequestError, match=match):
        parse_generate(body, vocab_size=4000, context_len=10)


def test_sampling_truncates_yet_reports_the_temperature_scaled_logprob():
    logits = torch.tensor([4.0, 3.5, 3.0, 0.0, -1.0])
    scaled, raw = torch.log_softmax(logits / 0.5, -1), torch.log_softmax(logits, -1)
    gen = torch.Generator().manual_seed(0)
    draws = [choose_token(logits, parse_sampling({"temperature": 0.5, "top_k": 2}), gen) for _ in range(200)]
    assert {t for t, _ in draws} == {0, 1}
    assert all(lp == pytest.approx(float(scaled[t]), abs=1e-6) for t, lp in draws)   # before truncation
    top_p = parse_sampling({"temperature": 0.5, "top_p": 0.5})     # token 0 alone holds more than half the mass
    assert {choose_token(logits, top_p, gen)[0] for _ in range(50)} == {0}
    min_p = parse_sampling({"min_p": 0.3})                       # keeps p >= 0.3 * p(0): tokens 0, 1 and 2
    assert {choose_token(logits, min_p, gen)[0] for _ in range(300)} == {0, 1, 2}
    token, lp = choose_token(logits, parse_sampling({"temperature": 0.5}), gen, original_logprob=True)
    assert lp == pytest.approx(float(raw[token]), abs=1e-6)
    assert choose_token(logits, parse_sampling({"temperature": 0.0}), None) == (0, pytest.approx(float(raw[0])))


def test_finish_checks_length_before_stop_tokens():
    sampling = parse_sampling({"max_new_tokens": 3, "stop_token_ids": [7]})
    eos = frozenset({9})
    assert finish_reason([], sampling, eos) is None
    assert finish_reason([1, 7], sampling, eos) == {"type": "stop", "matched": 7}
    assert finish_reason([9], sampling, eos) == {"type": "stop", "matched": 9}          # the model's EOS
    assert finish_reason([1, 2, 7], sampling, eos) == {"type": "length", "length": 3}
    assert finish_reason([9], parse_sampling({"ignore_eos": True, "stop_token_ids": [9]}), eos) is None
    assert finish_reason([], parse_sampling({"max_new_tokens": 0}), eos) == {"type": "length", "length": 0}
    stop = {"type": "stop", "matched": 7}
    assert text_ids([1, 7], stop, sampling) == [1]
    assert text_ids([1, 7], stop, parse_sampling({"no_stop_trim": True})) == [1, 7]
    assert text_ids([1, 0], {"type": "stop", "matched": 0}, sampling) == [1, 0]   # SGLang's `if not matched`


def test_request_seeds():
    def req(seed=None, rid=None):
        return GenerateRequest((1,), parse_sampling({"sampling_seed": seed}), False, rid)
    fallback = random.Random(0)
    assert request_seed(req(seed=5, rid="a"), 0, fallback) == 5
    assert request_seed(req(seed=-1), 0, fallback) == 2**64 - 1
    assert request_seed(req(rid="a"), 0, fallback) == request_seed(req(rid="a"), 0, fallback)
    assert request_seed(req(rid="a"), 0, fallback) != request_seed(req(rid="a"), 1, fallback)
    assert request_seed(req(), 0, fallback) != request_seed(req(), 0, fallback)


# -- the server ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(tiny_model):
    return Engine(tiny_model)


@pytest.fixture(scope="module")
def server(engine):
    with ServerThread(engine) as running:
        yield running


def generate(url, input_ids=PROMPT, *, return_logprob=True, rid=None, timeout=30, **sampling):
    body = {"input_ids": list(input_ids), "sampling_params": {"max_new_tokens": 12, **sampling},
            "return_logprob": return_logprob}
    if rid is not None:
        body["rid"] = rid
    r = httpx.post(f"{url}/generate", json=body, timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()


def model_logprobs(model_dir, input_ids, output_ids, temperature=1.0):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([[*input_ids, *output_ids]])).logits[0]
    scores = torch.log_softmax(logits[len(input_ids) - 1:-1] / temperature, -1)
    return scores[torch.arange(len(output_ids)), torch.tensor(output_ids)].tolist()


def test_replies_have_sglangs_shape_and_greedy_is_deterministic(server, tiny_model):
    first, again = generate(server.url, temperature=0, rid="r-1"), generate(server.url, temperature=0)
    assert first["output_ids"] == again["output_ids"] and len(first["output_ids"]) == 12
    scripted = ScriptedUpstream(tiny_model).reply({"input_ids": PROMPT, "return_logprob": True,
                                                   "sampling_params": {"max_new_tokens": 12}},
                                                  {"role": "assistant", "content": "Fixed it."})
    assert first.keys() == scripted.keys() and first["meta_info"].keys() == scripted["meta_info"].keys()
    meta = first["meta_info"]
    assert (meta["id"], meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == ("r-1", 6, 12, 0)
    assert meta["finish_reason"] == {"type": "length", "length": 12} and meta["weight_version"] == "default"
    parsed = parse_generation(first)                    # what the adapter reads
    assert parsed.output_ids == first["output_ids"] and parsed.finish_reason == "length"
    assert first["text"] == server.engine.tokenizer.decode(first["output_ids"])
    info = httpx.get(f"{server.url}/get_model_info").json()
    assert info["model_path"] == info["tokenizer_path"] == str(tiny_model) and info["is_generation"] is True
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.post(f"{server.url}/generate", json={"input_ids": [1], "sampling_params": {"seed": 1}}).json() == \
        {"error": {"message": "unknown sampling parameters ['seed'] (SGLang's seed is sampling_seed)"}}


def test_seeded_sampling_reproduces(server):
    a, b = (generate(server.url, temperature=1.0, sampling_seed=7)["output_ids"] for _ in range(2))
    c = generate(server.url, temperature=1.0, sampling_seed=8)["output_ids"]
    by_rid = [generate(server.url, temperature=1.0, rid="attempt-3")["output_ids"] for _ in range(2)]
    unseeded = [generate(server.url, temperature=1.0)["output_ids"] for _ in range(2)]
    assert a == b and a != c and by_rid[0] == by_rid[1] and unseeded[0] != unseeded[1]
    assert len(set(a)) > 1                               # sampled, not the greedy repetition


@pytest.mark.parametrize("sampling, temperature", [({"temperature": 0}, 1.0),
                                                   ({"temperature": 0.7, "top_p": 0.9, "sampling_seed": 3}, 0.7)])
def test_logprobs_match_a_forward_pass(server, tiny_model, sampling, temperature):
    reply = generate(server.url, max_new_tokens=16, **sampling)
    ids = reply["output_ids"]
    reported = [lp for lp, _, _ in reply["meta_info"]["output_token_logprobs"]]
    assert [t for _, t, _ in reply["meta_info"]["output_token_logprobs"]] == ids
    assert reported == pytest.approx(model_logprobs(tiny_model, PROMPT, ids, temperature), abs=1e-4)


def test_stop_tokens_end_the_output_and_stay_in_it(server):
    sampled = generate(server.url, max_new_tokens=16, sampling_seed=11)["output_ids"]
    k = next(i for i in range(2, 16) if sampled[i] not in sampled[:i])
    stop = sampled[k]
    stopped = generate(server.url, max_new_tokens=16, sampling_seed=11, stop_token_ids=[stop])
    assert stopped["output_ids"] == sampled[:k + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert len(stopped["meta_info"]["output_token_logprobs"]) == stopped["meta_info"]["completion_tokens"] == k + 1
    assert stopped["text"] == server.engine.tokenizer.decode(sampled[:k])
    at_limit = generate(server.url, max_new_tokens=k + 1, sampling_seed=11, stop_token_ids=[stop])
    assert at_limit["output_ids"] == sampled[:k + 1]
    assert at_limit["meta_info"]["finish_reason"] == {"type": "length", "length": k + 1}
    ignored = generate(server.url, max_new_tokens=16, sampling_seed=11, stop_token_ids=[stop], ignore_eos=True)
    assert ignored["output_ids"] == sampled


def test_concurrent_requests_equal_their_sequential_results(server):
    prompts = [[7 + i, 300 + 11 * i, 900 - i] for i in range(8)]
    kwargs = {"max_new_tokens": 8, "sampling_seed": 5}
    sequential = [generate(server.url, p, **kwargs)["output_ids"] for p in prompts]

    async def all_at_once():
        async with httpx.AsyncClient(timeout=60) as client:
            replies = await asyncio.gather(*(client.post(f"{server.url}/generate", json={
                "input_ids": p, "sampling_params": {"max_new_tokens": 8, "sampling_seed": 5}}) for p in prompts))
        return [r.json()["output_ids"] for r in replies]
    assert asyncio.run(all_at_once()) == sequential
    assert len({tuple(s) for s in sequential}) == 8


def in_background(fn, *args, **kwargs):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", fn(*args, **kwargs)), daemon=True)
    thread.start()
    return thread, result


def test_a_request_sent_while_paused_waits_for_continue(server):
    expected = generate(server.url, sampling_seed=2)["output_ids"]
    paused = httpx.post(f"{server.url}/pause_generation", json={"mode": "in_place"})
    assert paused.json() == {"message": "Generation paused successfully.", "status": "ok"}
    try:
        thread, result = in_background(generate, server.url, sampling_seed=2)
        thread.join(1.0)
        assert thread.is_alive() and not result
        assert httpx.get(f"{server.url}/health").status_code == 200        # control routes still answer
    finally:
        resumed = httpx.post(f"{server.url}/continue_generation", json={})
    assert resumed.json() == {"message": "Generation continued successfully.", "status": "ok"}
    thread.join(30)
    assert result["value"]["output_ids"] == expected
    assert httpx.post(f"{server.url}/pause_generation", json={"mode": "later"}).status_code == 400


def wait_until_busy(url):
    """Until a request is in flight: /flush_cache refuses then, as SGLang's does."""
    wait_until(lambda: httpx.post(f"{url}/flush_cache").status_code == 400, 10, "a request in flight", poll_s=0.01)


def test_pause_with_abort_ends_requests_in_flight(server):
    thread, result = in_background(generate, server.url, max_new_tokens=400, sampling_seed=4)
    wait_until_busy(server.url)
    try:
        assert httpx.post(f"{server.url}/pause_generation", json={}).status_code == 200   # mode "abort"
        thread.join(30)
        reply = result["value"]
        meta = reply["meta_info"]
        assert meta["finish_reason"] == {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
        assert len(reply["output_ids"]) == meta["completion_tokens"] == len(meta["output_token_logprobs"]) < 400
        assert parse_generation(result["value"]).finish_reason == "abort"
        later, later_result = in_background(generate, server.url, sampling_seed=4)
        later.join(0.5)
        assert later.is_alive()
    finally:
        httpx.post(f"{server.url}/continue_generation")
    later.join(30)
    assert later_result["value"]["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert httpx.post(f"{server.url}/flush_cache").status_code == 200


def test_pause_with_abort_answers_once_no_request_is_left_in_flight(engine, server):
    """As SGLang's (its tokenizer manager aborts until no request holds the model-update lock): publishing
    weights flushes the cache right after, and a flush with a request still running fails. Found by the
    learning benchmark with rollouts ahead of training, where requests keep coming during a publish."""
    thread, result = in_background(generate, server.url, max_new_tokens=400, sampling_seed=5)
    wait_until_busy(server.url)
    pause = None
    try:
        with engine._model_lock:       # the request is mid-token: it sees the abort only after this token
            pause, paused = in_background(httpx.post, f"{server.url}/pause_generation", json={}, timeout=30)
            pause.join(0.5)
            assert pause.is_alive(), "the pause answered while a request was in flight"
        pause.join(30)
        assert paused["value"].status_code == 200
        assert httpx.post(f"{server.url}/flush_cache").status_code == 200
        thread.join(30)
        assert result["value"]["meta_info"]["finish_reason"]["type"] == "abort"
    finally:
        httpx.post(f"{server.url}/continue_generation")


def perturbed_copy(model_dir, out_dir, scale=0.05):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    model.save_pretrained(out_dir)
    return out_dir


def test_update_weights_from_disk(tiny_model, tmp_path):
    new_dir = perturbed_copy(tiny_model, tmp_path / "step-7")
    with ServerThread(Engine(tiny_model)) as server:
        before = generate(server.url, temperature=0)
        thread, long_result = in_background(generate, server.url, max_new_tokens=300, temperature=0)
        wait_until_busy(server.url)
        r = httpx.post(f"{server.url}/update_weights_from_disk",
                       json={"model_path": str(new_dir), "weight_version": "7"}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json() == {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        thread.join(30)
        after = generate(server.url, temperature=0)
        info = httpx.get(f"{server.url}/get_model_info").json()
        bad = httpx.post(f"{server.url}/update_weights_from_disk", json={"model_path": str(tmp_path / "none")})
        assert (bad.status_code, bad.json()["success"]) == (400, False)
        assert httpx.get(f"{server.url}/weight_version").json() == {"weight_version": "7"}
    # The request in flight finished on the old weights alone: the update waited for it.
    long_reply = long_result["value"]
    assert long_reply["meta_info"]["weight_version"] == "default"
    assert long_reply["meta_info"]["completion_tokens"] == 300
    assert [lp for lp, _, _ in long_reply["meta_info"]["output_token_logprobs"]] == \
        pytest.approx(model_logprobs(tiny_model, PROMPT, long_reply["output_ids"]), abs=1e-4)
    assert after["meta_info"]["weight_version"] == "7"
    assert (info["model_path"], info["tokenizer_path"], info["weight_version"]) == (str(new_dir), str(tiny_model), "7")
    new_logprobs = [lp for lp, _, _ in after["meta_info"]["output_token_logprobs"]]
    old_logprobs = [lp for lp, _, _ in before["meta_info"]["output_token_logprobs"]]
    assert new_logprobs != pytest.approx(old_logprobs, abs=1e-3)
    assert new_logprobs == pytest.approx(model_logprobs(new_dir, PROMPT, after["output_ids"]), abs=1e-4)


def test_while_paused_an_update_does_not_wait_for_held_requests(tiny_model, tmp_path):
    new_dir = perturbed_copy(tiny_model, tmp_path / "step-8")
    with ServerThread(Engine(tiny_model)) as server:
        thread, result = in_background(generate, server.url, max_new_tokens=300, temperature=0)
        wait_until_busy(server.url)
        httpx.post(f"{server.url}/pause_generation", json={"mode": "retract"})
        r = httpx.post(f"{server.url}/update_weights_from_disk",
                       json={"model_path": str(new_dir), "weight_version": "8"}, timeout=10)
        assert r.json()["success"] and thread.is_alive()       # the held request is still held
        httpx.post(f"{server.url}/continue_generation")
        thread.join(30)
    meta = result["value"]["meta_info"]
    # SGLang's semantics when paused: the request resumes on the new weights and reports their version.
    assert meta["weight_version"] == "8" and meta["finish_reason"] == {"type": "length", "length": 300}


def test_weights_of_another_shape_are_refused(tiny_model, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model)
    config.intermediate_size = 96
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "other")
    engine = Engine(tiny_model)
    ok, message = engine.load_weights(str(tmp_path / "other"), "9")
    assert not ok and "do not fit the served model" in message and "mlp" in message
    assert (engine.weight_version, engine.model_path) == ("default", str(tiny_model))


def test_the_command_registers_heartbeats_and_stops_on_sigterm(tiny_model, tmp_path):
    layout = RunLayout.create(tmp_path / "run")
    registry = Registry(layout.services_dir)
    proc = subprocess.Popen([sys.executable, "-m", "hpc.inference.cpu_server", "--model", str(tiny_model),
                             "--port", "0", "--register", str(layout.root), "--index", "2", "--heartbeat-s", "0.2",
                             "--weight-version", "3"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.split("listening on ")[1].split()[0]
        [record] = registry.services("inference")
        assert (record.index, record.host, record.weight_version) == (2, "127.0.0.1", 3)
        assert url == f"http://127.0.0.1:{record.port}"
        assert generate(url, max_new_tokens=3, temperature=0)["meta_info"]["weight_version"] == "3"
        wait_until(lambda: registry.services("inference")[0].heartbeat > record.heartbeat, 10, "a second heartbeat")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "cpu_server: stopped" in out
    assert registry.services("inference") == []


def test_a_device_torch_cannot_use_is_refused_at_start(tiny_model):
    import subprocess
    import sys
    device, said = ("gpu0", "--device gpu0:") if torch.cuda.is_available() else ("cuda", "sees no CUDA GPU here")
    r = subprocess.run([sys.executable, "-m", "hpc.inference.cpu_server", "--model", str(tiny_model),
                        "--device", device], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and said in r.stderr, r.stderr


def test_the_server_runs_torch_on_the_threads_it_is_given_and_refuses_none(tiny_model, monkeypatch, capsys):
    """One intra-op thread while it serves unless told otherwise (benchmarks/server_threads_bench.py: a decode
    step of a tiny model is slower split over cores that the sandboxes beside it want), the process's own count
    back afterwards; --threads 0 is refused at start."""
    from hpc.inference import cpu_server

    seen = []

    async def serve(engine, args):
        seen.append(torch.get_num_threads())
    monkeypatch.setattr(cpu_server, "serve", serve)
    before = torch.get_num_threads()
    for argv, want in (([], cpu_server.SERVER_THREADS), (["--threads", "3"], 3)):
        assert cpu_server.main(["--model", str(tiny_model), *argv]) == 0
        assert seen.pop() == want and torch.get_num_threads() == before
    with pytest.raises(SystemExit) as e:
        cpu_server.main(["--model", str(tiny_model), "--threads", "0"])
    assert e.value.code == 2 and "--threads must be 1 or more, got 0" in capsys.readouterr().err


def test_the_dtype_and_routes_flags_reach_the_servers_options(tiny_model, monkeypatch, capsys):
    from hpc.inference import cpu_server

    seen = []
    monkeypatch.setattr(cpu_server, "run", lambda opts: seen.append(opts) or 0)
    assert cpu_server.main(["--model", str(tiny_model), "--dtype", "bfloat16", "--enable-return-routed-experts"]) == 0
    assert (seen[0].dtype, seen[0].enable_return_routed_experts) == ("bfloat16", True)
    with pytest.raises(SystemExit):
        cpu_server.main(["--model", str(tiny_model), "--dtype", "float16"])
    assert "invalid choice: 'float16'" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (tools/gpu_check.sh runs it there)")
def test_on_a_gpu_the_server_answers_as_on_the_cpu(tiny_model, engine):
    """The same requests, greedy and seeded, on the GPU and the CPU: the same tokens, log-probs to 1e-4."""
    with ServerThread(Engine(tiny_model, device="cuda")) as gpu, ServerThread(engine) as cpu:
        for sampling in ({"temperature": 0}, {"temperature": 1.0, "sampling_seed": 7}):
            a, b = generate(gpu.url, **sampling), generate(cpu.url, **sampling)
            assert a["output_ids"] == b["output_ids"]
            got = [lp for lp, _, _ in a["meta_info"]["output_token_logprobs"]]
            want = [lp for lp, _, _ in b["meta_info"]["output_token_logprobs"]]
            assert got == pytest.approx(want, abs=1e-4)
