"""Routing replay in megatron-core's MoE layers: the sampler's experts in the trainer's forward.

The torch backend's replay (hpc/inference/routing.py) swaps transformers' routers' forward. megatron-core
0.16 has the hook itself: with `moe_enable_routing_replay` each TopKRouter asks its `router_replay` for
the top k (`get_replay_topk(scores, topk, num_groups, group_topk, default_compute_topk)`), and its
mixing weights are the softmax of the router's own logits at those experts, so the router still trains.
Its RouterReplay takes one index tensor per layer for the whole forward and cannot leave a position to
the router; `PositionReplay` answers the same call with the routes of the micro-batch at hand, each
position's own top k where it holds NO_ROUTE (padding, a sample without routes), as the torch
backend's replay does. It registers nowhere global, so a policy and its reference model stay apart.

Positions: the routes come over the forward's [samples x longest] positions (tensors.padded_routes),
Megatron's hidden states run [sequence, batch]: `megatron_order` transposes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from hpc.inference.routing import NO_ROUTE, RoutingError


class PositionReplay:
    """One MoE layer's replay: `routes` [positions, top_k] in Megatron's order while set, else the router's own."""

    def __init__(self) -> None:
        self.routes: Tensor | None = None

    def get_replay_topk(self, scores: Tensor, topk: int, num_groups: int | None = None,
                        group_topk: int | None = None,
                        default_compute_topk: Callable[..., tuple[Tensor, Tensor]] | None = None
                        ) -> tuple[Tensor, Tensor]:
        assert default_compute_topk is not None     # megatron-core always passes it
        probs, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        if self.routes is None:
            return probs, own
        given = self.routes.to(own.device)
        if given.shape != own.shape:
            raise RoutingError(f"routes cover {tuple(given.shape)} (positions, top_k), the forward routes "
                               f"{tuple(own.shape)}")
        indices = torch.where(given == NO_ROUTE, own, given)
        return scores.gather(1, indices), indices


def moe_routers(model: torch.nn.Module) -> list[Any]:
    """The model's megatron-core routers in layer order, each with its replay hook (moe_enable_routing_replay)."""
    return [m for m in model.modules() if hasattr(m, "router_replay") and hasattr(m, "topk")]


def install(model: torch.nn.Module) -> int:
    """Give each router a PositionReplay in place of megatron-core's RouterReplay; the MoE layers found."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    found = moe_routers(model)
    for router in found:
        if router.router_replay is None:
            raise RoutingError("the model was built without moe_enable_routing_replay: its routers ask no replay")
        if router.router_replay in RouterReplay.global_router_replay_instances:    # kept alive there otherwise
            RouterReplay.global_router_replay_instances.remove(router.router_replay)
        router.router_replay = PositionReplay()
    return len(found)


def megatron_order(routes: Tensor, samples: int) -> Tensor:
    """[samples x longest, width] routes (padded_routes) as [longest x samples, width]: Megatron's order."""
    return routes.reshape(samples, -1, routes.shape[-1]).transpose(0, 1).reshape(-1, routes.shape[-1])


@contextmanager
def replay(model: torch.nn.Module, routes: Tensor | None) -> Iterator[None]:
    """Within the block, `model`'s routers take `routes` ([positions in Megatron's order, layers x top_k]);
    with None, their own choice."""
    found = moe_routers(model)
    if routes is not None:
        if not found or not all(isinstance(r.router_replay, PositionReplay) for r in found):
            raise RoutingError("routing replay on a model without replaying MoE routers (install() first)")
        top_k = found[0].topk
        if routes.shape[1] != len(found) * top_k:
            raise RoutingError(f"routes {routes.shape[1]} wide; the model routes {len(found)} MoE layers x {top_k} "
                               "experts: were they recorded from another model?")
        per_layer = routes.reshape(len(routes), len(found), top_k)
        for layer, router in enumerate(found):
            router.router_replay.routes = per_layer[:, layer, :]
    try:
        yield
    finally:
        for router in found:
            if isinstance(router.router_replay, PositionReplay):
                router.router_replay.routes = None
