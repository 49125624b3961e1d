"""A mixture of experts' routes (hpc/inference/routing.py): captured by the CPU stand-in in SGLang's reply
shape, and replayed in a forward, on the tiny MoE model."""

import httpx
import numpy as np
import pytest
import torch

from agentrl.sample import SAMPLE_CODEC, AttemptMetadata
from hpc.inference import routing
from hpc.inference.cpu_server import Engine, ServerThread

pytestmark = pytest.mark.integration    # the tiny MoE model, a server

pytest_plugins = ["tiny_assets"]

PROMPT = [101, 202, 303, 404, 505, 606, 707]


@pytest.fixture(scope="module")
def model(tiny_moe_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_moe_model, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def server(tiny_moe_model):
    with ServerThread(Engine(tiny_moe_model, return_routed_experts=True)) as running:
        yield running


def full_forward_routes(model, ids) -> np.ndarray:
    with torch.inference_mode(), routing.capture(model) as calls:
        model(input_ids=torch.tensor([ids]))
    return routing.captured(calls)


def test_the_tiny_moe_is_a_mixture_of_experts_and_the_dense_model_is_not(model, tiny_model):
    from transformers import AutoConfig

    assert routing.moe_shape(model.config) == (2, 2, 8) and len(routing.routers(model)) == 2
    assert routing.moe_shape(AutoConfig.from_pretrained(tiny_model)) is None


def test_the_server_returns_each_fed_positions_experts_as_sglang_does(server, model):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 9, "sampling_seed": 1},
            "return_logprob": True, "return_routed_experts": True}
    reply = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
    out = reply["output_ids"]
    rows = len(PROMPT) + len(out) - 1
    routes = routing.decode(reply["meta_info"]["routed_experts"], rows=rows).reshape(rows, 2, 2)
    # [0, seqlen - 1): the prompt and every output token but the last, as one forward over them routes them
    assert (routes == full_forward_routes(model, [*PROMPT, *out[:-1]])).all()
    assert len(np.unique(routes)) > 2                   # a router that sends everything one way would pass too
    later = httpx.post(f"{server.url}/generate", json={**body, "routed_experts_start_len": 5}, timeout=60).json()
    assert later["output_ids"] == out                   # seeded: the same tokens
    from_5 = routing.decode(later["meta_info"]["routed_experts"], rows=rows - 5)
    assert (from_5 == routes[5:].reshape(rows - 5, 4)).all()
    plain = httpx.post(f"{server.url}/generate", json={**body, "return_routed_experts": False}, timeout=60).json()
    assert "routed_experts" not in plain["meta_info"]


@pytest.mark.parametrize("body, status, words", [
    ({"routed_experts_start_len": 8}, 400, "routed_experts_start_len must be in [0, 7]"),
    ({"routed_experts_start_len": -1}, 400, "routed_experts_start_len must be in [0, 7]"),
])
def test_a_start_past_the_prompt_is_refused(server, body, status, words):
    r = httpx.post(f"{server.url}/generate", json={"input_ids": PROMPT, "return_routed_experts": True, **body})
    assert r.status_code == status and words in r.text


def test_a_server_without_the_flag_refuses_to_return_experts_and_a_dense_model_cannot_have_it(tiny_moe_model,
                                                                                            tiny_model):
    with ServerThread(Engine(tiny_moe_model)) as plain:
        r = httpx.post(f"{plain.url}/generate", json={"input_ids": PROMPT, "return_routed_experts": True})
    assert r.status_code == 400 and "--enable-return-routed-experts" in r.text
    with pytest.raises(ValueError, match="has no MoE layer"):
        Engine(tiny_model, return_routed_experts=True)


def test_replay_uses_the_given_experts_and_only_them(model):
    ids = torch.tensor([PROMPT * 3])
    own = full_forward_routes(model, PROMPT * 3)
    with torch.inference_mode():
        base = model(input_ids=ids).logits
        with routing.replay(model, torch.from_numpy(own)):
            same = model(input_ids=ids).logits
        other = own.copy()
        other[:, :, 0], other[:, :, 1] = own[:, :, 1] ^ 1, own[:, :, 0] ^ 1    # each pair moved to its neighbours
        other = np.where(other[:, :, :1] == other[:, :, 1:], own, other)
        with routing.replay(model, torch.from_numpy(other)):
            moved = model(input_ids=ids).logits
        unrecorded = np.full_like(own, routing.NO_ROUTE)
        with routing.replay(model, torch.from_numpy(unrecorded)):
            own_choice = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert torch.equal(same, base) and torch.equal(own_choice, base) and torch.equal(after, base)
    assert (moved - base).abs().max() > 1e-3


def test_replayed_routes_still_train_the_router(model):
    ids = torch.tensor([PROMPT])
    routes = torch.from_numpy(full_forward_routes(model, PROMPT))
    model.zero_grad()
    with routing.replay(model, routes):
        model(input_ids=ids).logits.float().logsumexp(-1).sum().backward()
    grads = [r.weight.grad for r in routing.routers(model)]
    model.zero_grad()
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


def test_routes_of_the_wrong_shape_are_refused(model):
    routes = torch.from_numpy(full_forward_routes(model, PROMPT))
    with pytest.raises(routing.RoutingError, match="routes for 1 MoE layers, the model has 2"):
        with routing.replay(model, routes[:, :1]):
            pass
    with pytest.raises(routing.RoutingError, match="cover 6 positions, the forward has 7"):
        with torch.inference_mode(), routing.replay(model, routes[:6]):
            model(input_ids=torch.tensor([PROMPT]))
    with pytest.raises(routing.RoutingError, match="20 ints, not a whole row for each of 3 positions"):
        routing.decode(routing.encode(np.zeros((5, 2, 2), np.int32)), rows=3)


def test_the_adapter_keeps_each_fed_positions_experts_along_its_chains(tiny_moe_model, model):
    """Three turns through the adapter's OpenAI endpoint, each asking only for the routes it lacks
    (routed_experts_start_len): every chain's routes are a full forward's over its tokens."""
    import asyncio

    from agentrl.adapter.app import CONTROL_HEADER, create_app
    from agentrl.adapter.service import Adapter, AdapterConfig, load_tokenizer
    from agentrl.adapter.upstream import UpstreamPool

    asked: list[int] = []

    async def go(url: str):
        cfg = AdapterConfig(tokenizer=tiny_moe_model, upstreams=[url], return_routed_experts=True, max_new_tokens=6)
        pool = UpstreamPool(cfg.upstreams)
        real = pool.generate

        async def spy(url, ids, sampling, *, routes_from=None):
            asked.append(routes_from)
            return await real(url, ids, sampling, routes_from=routes_from)
        pool.generate = spy
        adapter = Adapter(cfg, load_tokenizer(tiny_moe_model), pool)
        ctl = {CONTROL_HEADER: "ctl"}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(adapter, "ctl")),
                                     base_url="http://adapter") as c:
            key = (await c.post("/_agentrl/open_session", json={}, headers=ctl)).json()["key"]
            body = {"model": "m", "messages": [{"role": "user", "content": "Fix the bug."}],
                    "temperature": 1.0, "seed": 3}
            for step in range(3):
                r = await c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
                assert r.status_code == 200, r.text
                body["messages"] += [r.json()["choices"][0]["message"], {"role": "user", "content": f"go on {step}"}]
        await pool.aclose()
        return adapter.sessions.finish(key)

    with ServerThread(Engine(tiny_moe_model, return_routed_experts=True)) as server:
        finished = asyncio.run(go(server.url))
    assert asked[0] == 0 and len(asked) == 3 and finished.stats["turns_without_routes"] == 0
    for chain in finished.chains:
        routes = chain.routed_experts
        assert routes is not None and routes.shape == (len(chain.tokens), 4)
        assert (routes[:-1] == full_forward_routes(model, chain.tokens[:-1]).reshape(-1, 4)).all()
        assert (routes[-1] == routing.NO_ROUTE).all()       # the last token was never fed
        sample = chain.to_sample(reward=1.0, group_index=0, attempt=0, metadata=AttemptMetadata())
        assert (SAMPLE_CODEC.from_record(SAMPLE_CODEC.to_record(sample)).routed_experts == routes).all()
    if len(finished.chains) == 1:     # one chain: the later turns asked from the end of what they held
        assert 0 < asked[1] < asked[2]
