"""A mixture of experts' routes: which experts each token went to, captured where it was sampled and
replayed where it is trained (routing replay, "R3").

In an MoE layer a router picks each token's top-k experts. The sampler and the trainer compute the
router's logits with different kernels and precisions, so a near tie can go one way in one and the
other way in the other: the trainer then differentiates another function than the one that sampled.
Replay makes the trainer's forward use the sampler's experts (the mixing weights still come from the
trainer's router, over those experts, so the router trains).

SGLang's wire form (`return_routed_experts` in /generate; 0.5.12 and later): meta_info["routed_experts"]
is base64 of int32 [positions, layers, top_k], positions [routed_experts_start_len, seqlen - 1): every
token the model took as input (the prompt and all output tokens but the last).

Works on transformers' MoE routers (Qwen2-MoE, Qwen3-MoE: a `*TopKRouter` module per MoE layer whose
forward maps hidden states to (logits, top-k weights, top-k indices)), on the CPU stand-in and the torch
trainer alike.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

NO_ROUTE = -1       # in a routes array: no recorded route at this position (the router's own choice is used)


class RoutingError(ValueError):
    pass


def routers(model: Any) -> list[Any]:
    """The model's MoE routers in layer order (empty for a dense model)."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


def moe_shape(config: Any) -> tuple[int, int, int] | None:
    """(MoE layers, experts per token, experts) of an HF config, or None when it has no MoE layer."""
    experts = (getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
               or getattr(config, "n_routed_experts", None))
    top_k = getattr(config, "num_experts_per_tok", None)
    if not experts or not top_k:
        return None
    layers = config.num_hidden_layers
    step = getattr(config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(config, "mlp_only_layers", None) or ())
    moe_layers = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    return (moe_layers, int(top_k), int(experts)) if moe_layers else None


def encode(routes: np.ndarray) -> str:
    """SGLang's wire form of [positions, layers, top_k] routes."""
    return base64.b64encode(np.ascontiguousarray(routes, dtype=np.int32).tobytes()).decode("ascii")


def decode(payload: str, *, rows: int) -> np.ndarray:
    """[rows, layers x top_k] int32 from SGLang's wire form of `rows` positions (the reader need not know
    the model: the trainer checks the width against its own); refused when it does not divide."""
    try:
        flat = np.frombuffer(base64.b64decode(payload, validate=True), dtype=np.int32)
    except (ValueError, TypeError) as e:
        raise RoutingError(f"routed_experts is not base64 of int32: {e}") from None
    if rows <= 0 or flat.size % rows:
        raise RoutingError(f"routed_experts holds {flat.size} ints, not a whole row for each of {rows} positions")
    return flat.reshape(rows, -1)


@contextmanager
def capture(model: Any) -> Iterator[list[list[Any]]]:
    """Record every forward's chosen experts: yields one list per router (layer), each call's [tokens, top_k]
    indices appended as the forward runs."""
    found = routers(model)
    calls: list[list[Any]] = [[] for _ in found]
    hooks = [router.register_forward_hook(lambda _m, _i, out, k=k: calls[k].append(out[2].detach().cpu()))
             for k, router in enumerate(found)]
    try:
        yield calls
    finally:
        for hook in hooks:
            hook.remove()


def captured(calls: list[list[Any]]) -> np.ndarray:
    """capture's record as [positions, layers, top_k] int32, positions in the order they were fed."""
    import torch

    if not calls:
        raise RoutingError("the model has no MoE router to capture")
    return torch.stack([torch.cat(layer) for layer in calls], dim=1).numpy().astype(np.int32)


@contextmanager
def replay(model: Any, routes: Any) -> Iterator[None]:
    """Within the block, each forward's routers use `routes` (a [tokens, layers, top_k] integer tensor over
    the forward's flattened [batch x sequence] positions, or [tokens, layers x top_k] as samples keep them)
    instead of their own top-k; a position whose row holds NO_ROUTE keeps the router's own choice. The
    mixing weights are the router's softmax at the replayed experts (renormalised where the router
    renormalises), so gradients still reach the router."""
    import torch

    found = routers(model)
    if routes.dim() == 2 and found:
        top_k = found[0].top_k
        if routes.shape[1] != len(found) * top_k:
            raise RoutingError(f"routes {routes.shape[1]} wide; the model routes {len(found)} MoE layers x "
                               f"{top_k} experts: were they recorded from another model?")
        routes = routes.reshape(len(routes), len(found), top_k)
    if routes.shape[1] != len(found):
        raise RoutingError(f"routes for {routes.shape[1]} MoE layers, the model has {len(found)}")
    originals = [router.forward for router in found]

    def routed(router: Any, layer: int):
        def forward(hidden_states: torch.Tensor):
            logits, _scores, own = originals[layer](hidden_states)
            given = routes[:, layer, :].to(own.device, own.dtype)
            if given.shape != own.shape:
                raise RoutingError(f"routes cover {given.shape[0]} positions, the forward has {own.shape[0]}")
            indices = torch.where(given == NO_ROUTE, own, given)
            weights = torch.softmax(logits, dtype=torch.float, dim=-1).gather(-1, indices)
            if getattr(router, "norm_topk_prob", False):
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(logits.dtype), indices
        return forward

    for layer, router in enumerate(found):
        router.forward = routed(router, layer)
    try:
        yield
    finally:
        for router in found:
            del router.forward      # the instance attribute: the class's forward again
