"""The megatron backend: a megatron-core GPTModel built from a Qwen2 or Qwen3-MoE HF model, tensor-parallel.

TorchPolicy's interface, for models whose layers must be split over GPUs. Parallel sizes come from
megatron-core's parallel state, which `init_model_parallel` sets up over the default process group.
What the local layer spec (no Transformer Engine) allows, and so what this does:
- Tensor parallelism only: context parallelism needs TEDotProductAttention (the local one asserts
  context_parallel_size == 1), pipeline parallelism Megatron's schedules, which allocate on "cuda".
- Padded micro-batches as in TorchPolicy: the local DotProductAttention refuses PackedSeqParams.
  Samples are right-padded, so the causal mask alone keeps padding out of every real token's attention.
- On CPU, torch AdamW: megatron-core's optimizers and DistributedDataParallel allocate on "cuda". On
  GPU, Megatron's DistributedDataParallel and optimizer (optionally distributed).
save/load (megatron-core dist_checkpointing, resharding on load) and export_hf are collective: every
rank calls them with the same path; export_hf gathers the tensor-parallel shards and rank 0 writes.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from . import megatron_replay
from .batch import RolloutBatch, StepPlan
from .config import MegatronOptions, TrainConfig, moe_tensor_parallel_refusal
from .megatron_convert import (
    HFWeights,
    hf_to_megatron,
    layer_spec_kwargs,
    megatron_to_hf,
    moe_experts,
    rope_parameters,
    transformer_config_kwargs,
)
from .step import grpo_micro_batches, reduce_over_ranks
from .tensors import padded_routes, padded_tokens, response_slices
from .torch_backend import TOKENIZER_FILES


def init_model_parallel(options: MegatronOptions) -> None:
    """Set up megatron-core's process groups over the initialised default group, unless already set up."""
    from megatron.core import parallel_state as mpu

    if not mpu.model_parallel_is_initialized():
        mpu.initialize_model_parallel(options.tensor_parallel_size, options.pipeline_parallel_size,
                                      context_parallel_size=options.context_parallel_size)
    found = (mpu.get_tensor_model_parallel_world_size(), mpu.get_pipeline_model_parallel_world_size(),
             mpu.get_context_parallel_world_size())
    wanted = (options.tensor_parallel_size, options.pipeline_parallel_size, options.context_parallel_size)
    if found != wanted:
        raise ValueError(f"megatron-core was set up with (tensor, pipeline, context) parallel sizes {found}, "
                         f"the options ask for {wanted}")


class MegatronPolicy:
    """A Policy (agentrl/train/policy.py). megatron-core has no type information: its objects are Any here."""

    collective_io = True       # every rank saves and exports its own shard

    def __init__(self, model_dir: Path, cfg: TrainConfig, options: MegatronOptions | None = None):
        from megatron.core import parallel_state as mpu
        from megatron.core import tensor_parallel
        from transformers import AutoConfig

        self.cfg, self.model_dir, self.options = cfg, Path(model_dir), options or cfg.megatron
        if not (dist.is_initialized() and mpu.model_parallel_is_initialized()):
            raise RuntimeError("MegatronPolicy needs torch.distributed and megatron-core's parallel state: call "
                               "init_model_parallel(options) after init_process_group")
        self.rank = dist.get_rank()
        self.tp_rank, self.tp_size = mpu.get_tensor_model_parallel_rank(), mpu.get_tensor_model_parallel_world_size()
        self.dp_rank, self.dp_size = mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()
        if mpu.get_pipeline_model_parallel_world_size() > 1 or mpu.get_context_parallel_world_size() > 1:
            raise NotImplementedError("the megatron backend runs tensor parallelism only: pipeline parallelism "
                                      "needs Megatron's schedules and context parallelism Transformer Engine")
        self.cuda = torch.cuda.is_available()
        if self.options.bf16 and not self.cuda:
            raise ValueError("bf16 needs CUDA: on CPU the backend trains fp32 weights with torch AdamW")
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")
        torch.manual_seed(cfg.seed)
        if self.cuda:     # the tracker Megatron forks for dropout and tensor-parallel initialisation
            tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)
        self.hf_config = AutoConfig.from_pretrained(str(model_dir))
        if self.hf_config.vocab_size % self.tp_size:
            raise ValueError(f"vocab_size {self.hf_config.vocab_size} does not split over tensor_parallel_size "
                             f"{self.tp_size}")
        if moe_experts(self.hf_config) and self.tp_size > 1:
            raise NotImplementedError(moe_tensor_parallel_refusal(self.tp_size))
        if cfg.routing_replay and not moe_experts(self.hf_config):
            raise ValueError(f"train.routing_replay: the model at {model_dir} has no MoE layer: nothing to replay")
        hf_state = HFWeights(self.model_dir)
        self.module = self._build(hf_state)
        self.ref = None
        if cfg.kl_coef > 0:
            self.ref = self._build(hf_state).requires_grad_(False).eval()
        self.optimizer: _MegatronOptimizer | _CpuAdamW
        if self.cuda:
            self.model, self.optimizer = _megatron_training(self.module, cfg, self.options)
        else:
            self.model, self.optimizer = self.module, _CpuAdamW(self.module, cfg)
        self.steps = 0

    def _build(self, hf_state: HFWeights) -> Any:
        """A megatron-core GPTModel (a torch Module with Megatron's sharded_state_dict), on self.device."""
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer import TransformerConfig

        hf, dtype = self.hf_config, torch.bfloat16 if self.options.bf16 else torch.float32
        if moe_experts(hf):
            _define_te_general_gemm()
        config = TransformerConfig(
            **transformer_config_kwargs(hf), moe_enable_routing_replay=self.cfg.routing_replay,
            tensor_model_parallel_size=self.tp_size, params_dtype=dtype,
            bf16=self.options.bf16, use_cpu_initialization=not self.cuda,
            # Initialised although every weight is loaded next: only the initialisers mark weights as
            # tensor-parallel, and the gradient norm would count a split weight on one rank alone.
            perform_initialization=True,
            # Apex and Megatron's fused CUDA kernels are not installed. Per-token loss: Megatron's DDP then sums
            # gradients over data-parallel ranks, as the loss is already normalised over the whole step.
            bias_dropout_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
            apply_rope_fusion=False, gradient_accumulation_fusion=False, calculate_per_token_loss=True)
        model = GPTModel(config, get_gpt_layer_local_spec(**layer_spec_kwargs(hf)), vocab_size=hf.vocab_size,
                         max_sequence_length=hf.max_position_embeddings, position_embedding_type="rope",
                         rotary_base=rope_parameters(hf)["rope_theta"],
                         share_embeddings_and_output_weights=hf.tie_word_embeddings)
        weights = hf_to_megatron(hf_state, hf, tp_rank=self.tp_rank, tp_size=self.tp_size)
        _load_exactly(model, weights)
        if self.cfg.routing_replay:
            megatron_replay.install(model)
        return model.to(self.device).train()

    # ------------------------------------------------------------ forward

    def response_logprobs(self, model: torch.nn.Module, batch: RolloutBatch, indices: list[int]) -> Tensor:
        """Log-probs of each sample's response tokens under `model`, flat over the micro-batch."""
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        ids = padded_tokens(batch, indices).to(self.device)
        routes = padded_routes(batch, indices) if self.cfg.routing_replay else None
        # Routing replay: each MoE layer sends each token to the experts the sampler did (megatron_replay.py)
        with megatron_replay.replay(model, None if routes is None else
                                    megatron_replay.megatron_order(routes, len(indices)).to(self.device)):
            logits = self.logits(model, ids)[:, :-1].float() / self.cfg.rollout_temperature
        logp = -vocab_parallel_cross_entropy(logits, ids[:, 1:])    # this rank's vocabulary shard suffices
        return response_slices(logp, batch, indices)

    def logits(self, model: torch.nn.Module, ids: Tensor) -> Tensor:
        """[batch, length, this rank's vocabulary shard] for right-padded token ids [batch, length]."""
        length = ids.shape[1]
        positions = torch.arange(length, device=ids.device).expand_as(ids)
        # An explicit causal mask (True: hidden): left to itself the local attention builds one on "cuda".
        causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).triu(1)[None, None]
        return model(ids, positions, attention_mask=causal)

    # ------------------------------------------------------------ one optimizer step

    def train_step(self, batch: RolloutBatch, plan: StepPlan) -> dict[str, float]:
        cfg = self.cfg
        self.optimizer.zero_grad()
        # Gradients are summed over data-parallel ranks: the per-attempt reduction already divides by the step.
        totals = grpo_micro_batches(
            batch, plan, cfg, self.device, logprobs=lambda model, ix: self.response_logprobs(model, batch, ix),
            policy=self.model, behaviour=self.model, ref=self.ref)
        grad_norm = self.optimizer.step()
        self.steps += 1
        from megatron.core import parallel_state as mpu

        # Over the data-parallel group only: tensor-parallel ranks compute the same loss on the same samples.
        reduced = reduce_over_ranks(totals, device=self.device, group=mpu.get_data_parallel_group())
        return {**reduced, "grad_norm": grad_norm, "step_samples": plan.samples, "step_tokens": plan.tokens}

    # ------------------------------------------------------------ state

    def _sharded_state(self, *, loading: bool) -> dict:
        model = self.module.sharded_state_dict()
        return {"model": model, "optimizer": self.optimizer.sharded_state_dict(model, is_loading=loading)}

    def save(self, path: Path) -> None:
        """Model and optimizer state, sharded, into `path`/megatron. Collective: every rank calls it."""
        from megatron.core import dist_checkpointing

        target = Path(path) / "megatron"
        if self.rank == 0:
            target.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        dist_checkpointing.save(self._sharded_state(loading=False), str(target))

    def load(self, path: Path) -> None:
        """What `save` wrote, resharded to this run's tensor-parallel size if it differs. Collective."""
        from megatron.core import dist_checkpointing

        state = dist_checkpointing.load(self._sharded_state(loading=True), str(Path(path) / "megatron"))
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def export_hf(self, path: Path) -> None:
        """A Hugging Face directory (weights, config, tokenizer); collective, the global rank 0 writes."""
        from huggingface_hub import save_torch_state_dict

        shards = _gather_tensor_parallel(_parameters(self.module))
        if self.rank != 0:
            return
        state = megatron_to_hf(shards, self.hf_config)
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_torch_state_dict(state, path, metadata={"format": "pt"})
        shutil.copy2(self.model_dir / "config.json", path / "config.json")
        for name in TOKENIZER_FILES:
            if (self.model_dir / name).exists():
                shutil.copy2(self.model_dir / name, path / name)

    def fingerprint(self) -> str:
        """A hash of this rank's parameter shards: data-parallel replicas that agree on it hold the same model."""
        h = hashlib.sha256()
        for name, p in sorted(_parameters(self.module).items()):
            h.update(name.encode())
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]


# ---------------------------------------------------------------- the micro-batch's tensors (as TorchPolicy's)

# ---------------------------------------------------------------- optimizers

class _CpuAdamW:
    """torch AdamW, gradients summed over data-parallel ranks and clipped by the norm over tensor-parallel shards."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.torch = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.grad_clip = cfg.grad_clip

    def zero_grad(self) -> None:
        self.torch.zero_grad(set_to_none=True)

    def step(self) -> float:
        from megatron.core import parallel_state as mpu
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        for p in self.params:     # a rank without micro-batches still joins every reduction
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if mpu.get_data_parallel_world_size() > 1:
            for p in self.params:
                dist.all_reduce(p.grad, group=mpu.get_data_parallel_group())
        # Replicated parameters (norms) count once, not once per tensor-parallel rank.
        owned = [p.grad for p in self.params if p.grad is not None and param_is_not_tensor_parallel_duplicate(p)]
        squares = torch.nn.utils.get_total_norm(owned).square()
        dist.all_reduce(squares, group=mpu.get_tensor_model_parallel_group())
        norm = squares.sqrt()
        torch.nn.utils.clip_grads_with_norm_(self.params, self.grad_clip, norm)
        self.torch.step()
        return float(norm)

    def sharded_state_dict(self, model_state: dict, *, is_loading: bool) -> dict:
        # As megatron-core's FP32Optimizer does it, whose step() (gradient clipping) would need CUDA.
        from megatron.core.dist_checkpointing.optimizer import (
            get_param_id_to_sharded_param_map,
            optim_state_to_sharding_state,
        )

        for p in self.params:   # AdamW creates its state at its first step: the loader needs tensors to fill
            if not self.torch.state[p]:     # as at step 0, and so the same as none
                self.torch.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                       "exp_avg_sq": torch.zeros_like(p)}
        state = self.torch.state_dict()
        [step] = {float(s["step"]) for s in state["state"].values()}
        optim_state_to_sharding_state(state, get_param_id_to_sharded_param_map(model_state, self.params),
                                      exclude_keys=("step",))
        return {**state, "common_step": step}

    def load_state_dict(self, state: dict) -> None:
        step = state.pop("common_step")
        for param_state in state["state"].values():
            param_state["step"] = torch.tensor(step)
        self.torch.load_state_dict(state)


class _MegatronOptimizer:
    """megatron-core's DistributedDataParallel and optimizer (CUDA): gradient buffers, clipping, sharded state."""

    def __init__(self, ddp: Any, optimizer: Any):     # megatron-core's DistributedDataParallel and optimizer
        self.ddp, self.megatron = ddp, optimizer

    def zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()
        self.megatron.zero_grad()

    def step(self) -> float:
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([self.ddp])     # the data-parallel gradient reduction
        _, grad_norm, _ = self.megatron.step()
        return float(grad_norm)

    def sharded_state_dict(self, model_state: dict, *, is_loading: bool) -> dict:
        return self.megatron.sharded_state_dict(model_state, is_loading=is_loading)

    def load_state_dict(self, state: dict) -> None:
        self.megatron.load_state_dict(state)


def _megatron_training(module: Any, cfg: TrainConfig, options: MegatronOptions) -> tuple[Any, _MegatronOptimizer]:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp = DistributedDataParallel(
        config=module.config, module=module,
        ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                                 use_distributed_optimizer=options.distributed_optimizer))
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=cfg.lr, weight_decay=cfg.weight_decay, clip_grad=cfg.grad_clip,
                        bf16=options.bf16, params_dtype=module.config.params_dtype,
                        use_distributed_optimizer=options.distributed_optimizer), [ddp])
    return ddp, _MegatronOptimizer(ddp, optimizer)


def _define_te_general_gemm() -> None:
    # megatron-core 0.16.1's MoE router reads moe_utils.te_general_gemm, which it imports from Transformer
    # Engine and leaves undefined without it (a NameError at the first forward); None is its own "absent".
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


# ---------------------------------------------------------------- weights

def _parameters(model: torch.nn.Module) -> dict[str, Tensor]:
    # Megatron's layers add `_extra_state` entries (None, for Transformer Engine's FP8 metadata): not weights.
    return {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}


def _load_exactly(model: torch.nn.Module, weights: dict[str, Tensor]) -> None:
    expected = _parameters(model)
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    wrong = [k for k in expected.keys() & weights.keys() if expected[k].shape != weights[k].shape]
    if missing or unexpected or wrong:
        raise ValueError(f"HF -> Megatron conversion does not fit the model: missing {missing}, unexpected "
                         f"{unexpected}, shapes differ for {wrong}")
    model.load_state_dict(weights, strict=False)


def _gather_tensor_parallel(local: dict[str, Tensor]) -> list[dict[str, Tensor]]:
    """On the global rank 0, every tensor-parallel rank's parameters in rank order; elsewhere [].

    Collective over rank 0's tensor-parallel group; other groups return at once."""
    from megatron.core import parallel_state as mpu

    group = mpu.get_tensor_model_parallel_group()
    if 0 not in dist.get_process_group_ranks(group):
        return []
    size, first = dist.get_world_size(group), dist.get_rank() == 0
    shards: list[dict[str, Tensor]] = [{} for _ in range(size)] if first else []
    for name, t in sorted(local.items()):
        parts = [torch.empty_like(t) for _ in range(size)] if first else None
        dist.gather(t.detach().contiguous(), parts, group=group, group_dst=0)
        for shard, part in zip(shards, parts or [], strict=True):
            shard[name] = part.cpu()
    return shards
