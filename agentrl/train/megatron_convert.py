"""Hugging Face checkpoints <-> megatron-core GPTModel (local spec), one tensor-parallel shard at a time.

Two families: Qwen2 (dense, biases on q, k and v) and Qwen3-MoE (every layer a mixture of experts, q and
k normalised per head, no biases). Layouts that differ between the two (Megatron side per tensor-parallel rank):

    q_proj, k_proj, v_proj  -> linear_qkv    rows grouped per query group: [q heads of group g; k_g; v_g] for
                                             each g, a rank holding a contiguous run of groups
    gate_proj, up_proj      -> linear_fc1    [gate shard; up shard] (Megatron's GLU chunks fc1's output in two),
                                             the dense MLP's and each expert's (experts.E -> experts.local_experts.E)
    o_proj, down_proj       -> linear_proj, linear_fc2    split along the input dimension
    embed_tokens, lm_head   -> word_embeddings, output_layer    split along the vocabulary
    norms, q_norm, k_norm   -> replicated (q_layernorm, k_layernorm)
    mlp.gate (the router)   -> mlp.router, replicated

Pipeline stages are not handled here: every function sees the whole stack of layers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

ROW_SPLIT = 0     # column-parallel layers: each rank holds a slice of the output rows
COL_SPLIT = 1     # row-parallel layers: each rank holds a slice of the input columns

_LAYER = {        # Megatron name within a layer -> (HF name within a layer, tensor-parallel split or None)
    "input_layernorm.weight": ("input_layernorm.weight", None),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight", COL_SPLIT),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight", None),
}
_QK_NORMS = {
    "self_attention.q_layernorm.weight": ("self_attn.q_norm.weight", None),
    "self_attention.k_layernorm.weight": ("self_attn.k_norm.weight", None),
}
_ROUTER = {"mlp.router.weight": ("mlp.gate.weight", None)}


class UnsupportedModel(ValueError):
    pass


class HFWeights(Mapping[str, Tensor]):
    """A HF checkpoint's tensors, each read when asked for: a rank never holds more than its shard and one tensor."""

    def __init__(self, model_dir: Path):
        from safetensors import safe_open

        self._file: dict[str, Path] = {}
        for path in sorted(Path(model_dir).glob("*.safetensors")):
            with safe_open(str(path), "pt") as f:
                self._file.update(dict.fromkeys(f.keys(), path))
        if not self._file:
            raise FileNotFoundError(f"{model_dir} holds no *.safetensors weights")

    def __getitem__(self, name: str) -> Tensor:
        from safetensors import safe_open

        with safe_open(str(self._file[name]), "pt") as f:
            return f.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._file)

    def __len__(self) -> int:
        return len(self._file)


def transformer_config_kwargs(hf: Any) -> dict[str, Any]:
    """TransformerConfig arguments that make a GPTModel compute what the HF config `hf` does."""
    if hf.model_type not in ("qwen2", "qwen3_moe"):     # Llama lacks the q/k/v biases, dense Qwen3 is untested
        raise UnsupportedModel(f"only Qwen2 and Qwen3-MoE models are converted, got model_type={hf.model_type!r}")
    if getattr(hf, "use_sliding_window", False):
        raise UnsupportedModel("sliding-window attention is not converted (use_sliding_window is true)")
    rope = rope_parameters(hf)
    kind = rope.get("rope_type", rope.get("type", "default"))     # transformers 4 called it "type"
    if kind != "default":
        raise UnsupportedModel(f"only default rotary embeddings are converted, got rope_type={kind!r}")
    if getattr(hf, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"only SwiGLU MLPs are converted, got hidden_act={hf.hidden_act!r}")
    kwargs = dict(
        num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size, ffn_hidden_size=hf.intermediate_size,
        num_attention_heads=hf.num_attention_heads, num_query_groups=hf.num_key_value_heads,
        kv_channels=head_dim(hf), layernorm_epsilon=hf.rms_norm_eps, normalization="RMSNorm",
        gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, add_qkv_bias=qkv_bias(hf),
        hidden_dropout=0.0, attention_dropout=0.0,        # the policy's log-probs must be deterministic
    )
    experts = moe_experts(hf)
    if experts:
        # Qwen3-MoE's router: a softmax over all experts, the top k, renormalised over them when norm_topk_prob.
        # Megatron without pre-softmax takes the top k logits and their softmax: the same renormalised weights.
        kwargs.update(qk_layernorm=True, num_moe_experts=experts, moe_router_topk=hf.num_experts_per_tok,
                      moe_ffn_hidden_size=hf.moe_intermediate_size, moe_router_pre_softmax=not hf.norm_topk_prob,
                      # the HF model's forward adds no load-balancing loss either (output_router_logits off)
                      moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
                      moe_token_dispatcher_type="allgather")
    return kwargs


def layer_spec_kwargs(hf: Any) -> dict[str, Any]:
    """get_gpt_layer_local_spec's arguments for the HF config `hf` (after transformer_config_kwargs accepted it)."""
    experts = moe_experts(hf)
    return dict(normalization="RMSNorm", qk_layernorm=hf.model_type == "qwen3_moe",
                **(dict(num_experts=experts, moe_grouped_gemm=False) if experts else {}))


def moe_experts(hf: Any) -> int:
    """Experts a layer of a Qwen3-MoE config (0 for a dense model); refused where some layers are dense."""
    if hf.model_type != "qwen3_moe":
        return 0
    if list(getattr(hf, "mlp_only_layers", None) or ()) or (getattr(hf, "decoder_sparse_step", 1) or 1) != 1:
        raise UnsupportedModel("only MoE models whose every layer is a mixture of experts are converted (got "
                               f"mlp_only_layers={hf.mlp_only_layers}, decoder_sparse_step={hf.decoder_sparse_step})")
    return int(getattr(hf, "num_experts", None) or hf.num_local_experts)


def qkv_bias(hf: Any) -> bool:
    return True if hf.model_type == "qwen2" else bool(getattr(hf, "attention_bias", False))


def rope_parameters(hf: Any) -> dict[str, Any]:
    # transformers 5 moved rope_theta and rope_scaling into rope_parameters
    params = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(hf, "rope_theta", 10000.0))
    return params


def head_dim(hf: Any) -> int:
    return getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads


def _layer_tensors(hf: Any) -> dict[str, tuple[str, int | None]]:
    """Within a layer: Megatron name -> (HF name, tensor-parallel split), for the tensors mapped one to one."""
    names = dict(_LAYER)
    experts = moe_experts(hf)
    if hf.model_type == "qwen3_moe":
        names.update(_QK_NORMS)
    if experts:
        names.update(_ROUTER)
        names.update({f"mlp.experts.local_experts.{e}.linear_fc2.weight": (f"mlp.experts.{e}.down_proj.weight",
                                                                            COL_SPLIT) for e in range(experts)})
    else:
        names["mlp.linear_fc2.weight"] = ("mlp.down_proj.weight", COL_SPLIT)
    return names


def _glu_inputs(hf: Any) -> list[tuple[str, str]]:
    """Within a layer: (Megatron fc1 name, HF prefix of its gate_proj and up_proj) for each gated MLP."""
    experts = moe_experts(hf)
    if not experts:
        return [("mlp.linear_fc1.weight", "mlp.")]
    return [(f"mlp.experts.local_experts.{e}.linear_fc1.weight", f"mlp.experts.{e}.") for e in range(experts)]


def hf_to_megatron(hf_state: Mapping[str, Tensor], hf: Any, *, tp_rank: int = 0, tp_size: int = 1) -> dict[str, Tensor]:
    """This tensor-parallel rank's GPTModel state dict (parameters only) from a full HF state dict."""
    def shard(t: Tensor, split: int | None) -> Tensor:
        return t if split is None else t.chunk(tp_size, dim=split)[tp_rank].clone()

    out = {"embedding.word_embeddings.weight": shard(hf_state["model.embed_tokens.weight"], ROW_SPLIT),
           "decoder.final_layernorm.weight": hf_state["model.norm.weight"]}
    if not hf.tie_word_embeddings:
        out["output_layer.weight"] = shard(hf_state["lm_head.weight"], ROW_SPLIT)
    tensors, glus = _layer_tensors(hf), _glu_inputs(hf)
    for i in range(hf.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for mname, (hname, split) in tensors.items():
            out[dst + mname] = shard(hf_state[src + hname], split)
        attn = src + "self_attn."
        for kind in ("weight", "bias") if qkv_bias(hf) else ("weight",):
            q, k, v = (hf_state[f"{attn}{p}_proj.{kind}"] for p in "qkv")
            qkv = _fuse_qkv(q, k, v, hf)
            out[f"{dst}self_attention.linear_qkv.{kind}"] = shard(qkv, ROW_SPLIT)
        for fc1, mlp in glus:
            gate, up = (shard(hf_state[f"{src}{mlp}{p}_proj.weight"], ROW_SPLIT) for p in ("gate", "up"))
            out[dst + fc1] = torch.cat([gate, up])
    return out


def megatron_to_hf(tp_shards: Sequence[Mapping[str, Tensor]], hf: Any) -> dict[str, Tensor]:
    """The full HF state dict from every tensor-parallel rank's GPTModel state dict, in rank order."""
    def whole(name: str, split: int | None) -> Tensor:
        return tp_shards[0][name] if split is None else torch.cat([s[name] for s in tp_shards], dim=split)

    out = {"model.embed_tokens.weight": whole("embedding.word_embeddings.weight", ROW_SPLIT),
           "model.norm.weight": whole("decoder.final_layernorm.weight", None)}
    if not hf.tie_word_embeddings:
        out["lm_head.weight"] = whole("output_layer.weight", ROW_SPLIT)
    tensors, glus = _layer_tensors(hf), _glu_inputs(hf)
    for i in range(hf.num_hidden_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        for mname, (hname, split) in tensors.items():
            out[dst + hname] = whole(src + mname, split)
        for kind in ("weight", "bias") if qkv_bias(hf) else ("weight",):
            q, k, v = _split_qkv(whole(f"{src}self_attention.linear_qkv.{kind}", ROW_SPLIT), hf)
            out.update({f"{dst}self_attn.{p}_proj.{kind}": t for p, t in zip("qkv", (q, k, v), strict=True)})
        for fc1, mlp in glus:
            halves = [s[src + fc1].chunk(2) for s in tp_shards]
            out[f"{dst}{mlp}gate_proj.weight"] = torch.cat([gate for gate, _ in halves])
            out[f"{dst}{mlp}up_proj.weight"] = torch.cat([up for _, up in halves])
    return out


def _fuse_qkv(q: Tensor, k: Tensor, v: Tensor, hf: Any) -> Tensor:
    groups, d = hf.num_key_value_heads, head_dim(hf)
    rest = q.shape[1:]    # (hidden,) for weights, () for biases
    per_group = [q.reshape(groups, -1, d, *rest), k.reshape(groups, 1, d, *rest), v.reshape(groups, 1, d, *rest)]
    return torch.cat(per_group, dim=1).reshape(-1, *rest)


def _split_qkv(qkv: Tensor, hf: Any) -> tuple[Tensor, Tensor, Tensor]:
    groups, d = hf.num_key_value_heads, head_dim(hf)
    heads_per_group = hf.num_attention_heads // groups
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, heads_per_group + 2, d, *rest)
    q, k, v = grouped.split([heads_per_group, 1, 1], dim=1)
    return q.reshape(-1, *rest).contiguous(), k.reshape(-1, *rest).contiguous(), v.reshape(-1, *rest).contiguous()
