"""The trainer's configuration, validated in one place (the `train:` section of a run config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hpc.validation import validate_section

from .tracking import TrackingConfig


class TrainConfigError(ValueError):
    pass


def moe_tensor_parallel_refusal(tensor_parallel_size: int) -> str:
    """Why the megatron backend does not split a mixture of experts over tensor-parallel ranks (found running it)."""
    return (f"train.megatron.tensor_parallel_size {tensor_parallel_size} with a mixture-of-experts model: "
            "megatron-core 0.16 trains an MoE split over tensor-parallel ranks only with sequence parallelism "
            "(its MoE layer raises otherwise), and sequence parallelism only with Transformer Engine's or Apex's "
            "norms, while the backend builds the local layer spec (torch norms, no Transformer Engine); set "
            "tensor_parallel_size: 1 (data parallelism over more ranks is supported)")


class MegatronOptions(BaseModel):
    """`train.megatron`: model parallelism for backend: megatron (agentrl/train/megatron_backend.py)."""

    model_config = ConfigDict(extra="forbid")

    tensor_parallel_size: int = Field(default=1, gt=0)
    pipeline_parallel_size: int = Field(default=1, le=1, gt=0)    # 1 only, for now (see megatron_backend)
    context_parallel_size: int = Field(default=1, le=1, gt=0)     # 1 only, for now
    bf16: bool = False                  # GPU only: bf16 weights and activations, fp32 main weights in the optimizer
    distributed_optimizer: bool = True  # GPU only: shard optimizer state over the data-parallel ranks


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Path                                  # HF directory the run starts from
    prompt_data: Path                            # JSONL from `agentrl convert harbor`
    backend: Literal["torch", "megatron"] = "torch"
    megatron: MegatronOptions = Field(default_factory=MegatronOptions)
    # rollouts
    num_rollouts: int = Field(gt=0)
    rollout_batch_size: int = Field(gt=0)        # prompt groups per rollout
    n_samples_per_prompt: int = Field(gt=0)      # attempts per group
    max_tries: int = Field(default=3, gt=0)      # per attempt, for infrastructure failures
    min_complete_fraction: float = Field(default=1.0, gt=0, le=1)   # groups needed to train
    rollout_timeout_s: float = Field(default=24 * 3600.0, gt=0)     # then train on what is complete
    shuffle: bool = True
    seed: int = 0
    # Rollouts kept open ahead of the one trained on (docs/train.md, "Rollouts ahead of training"): 0 is the
    # synchronous loop; k > 0 lets sandboxes and servers work while the trainer trains, on tokens up to k
    # rollouts (+ publish_every - 1) behind the policy; older ones are masked (agentrl/train/staleness.py).
    max_staleness: int = Field(default=0, ge=0)
    # steps
    global_batch_size: int | None = Field(default=None, gt=0)   # attempts per optimizer step; None: all
    max_tokens_per_gpu: int = Field(default=32768, gt=0)
    lr: float = Field(default=1e-6, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    eps_clip: float = Field(default=0.2, gt=0, lt=1)
    eps_clip_high: float = Field(default=0.28, gt=0)
    kl_coef: float = Field(default=0.0, ge=0)
    tis_cap: float | None = Field(default=None, gt=0)    # recompute old logprobs; weigh by the sampler's
    std_normalize: bool = True
    # "shuffle_rewards": the control run, each group's rewards dealt to its attempts at random before the
    # advantages (agentrl/train/batch.py: shuffle_rewards); same compute, the learning signal removed
    control: Literal["shuffle_rewards"] | None = None
    # SGLang reports log softmax(logits / temperature) of what it sampled (before top-p/top-k), so the
    # trainer's log-probs use the same temperature, or every ratio is off from the first step.
    rollout_temperature: float = Field(default=1.0, gt=0)
    # Warn when a step's mean |log p_train - log p_rollout| over its trained tokens passes this (None: never;
    # agentrl/train/mismatch.py measures it on every step; docs/train.md, "Sampler and trainer").
    mismatch_warn: float | None = Field(default=0.05, gt=0)
    # An MoE model: the forward sends each token to the experts the sampler did (hpc/inference/routing.py), from
    # the routes the adapter recorded (needs pool.adapter.return_routed_experts and the servers' enable_return_
    # routed_experts; agentrl launch checks). Both backends: megatron through megatron-core's router replay hook.
    routing_replay: bool = False
    # checkpoints and weights
    save_every: int = Field(default=1, gt=0)             # rollouts between full checkpoints (state to resume)
    publish_every: int = Field(default=1, gt=0)          # rollouts between weight reloads of inference
    # Retention (agentrl/train/checkpoint.py): the newest keep_last full checkpoints keep their state; an
    # HF export goes once its eval summary exists ("until_evaluated"), or stays ("all")
    keep_last: int = Field(default=2, gt=0)
    keep_exports: Literal["until_evaluated", "all"] = "until_evaluated"
    evals_after_last: bool = False                       # publish weights after the last rollout too
    publish_timeout_s: float = Field(default=600.0, gt=0)
    colocated: bool = False     # inference shares the trainer's GPUs: it releases its memory while training
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)     # W&B, besides metrics.jsonl

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        attempts = self.rollout_batch_size * self.n_samples_per_prompt
        if self.global_batch_size is not None and attempts % self.global_batch_size:
            raise ValueError(f"global_batch_size {self.global_batch_size} does not divide the rollout's "
                             f"{attempts} attempts (rollout_batch_size x n_samples_per_prompt)")
        if self.colocated and self.max_staleness:
            raise ValueError(f"max_staleness {self.max_staleness} with colocated: true: colocated servers release "
                             "their GPU memory while the trainer trains, so no rollout can run meanwhile; set "
                             "max_staleness: 0, or give inference GPUs of its own (colocated: false)")
        return self

    def missing_paths(self) -> list[str]:
        """What the config names that is not there (yet): on the machine that trains, a refusal; in a
        dry run off the cluster, a warning."""
        problems = []
        if not (self.model / "config.json").is_file():
            problems.append(f"model: {self.model} holds no config.json (a Hugging Face model directory)")
        if not self.prompt_data.is_file():
            problems.append(f"prompt_data: {self.prompt_data} does not exist (make it with "
                            "`agentrl convert harbor TASKS --out prompts.jsonl`)")
        return problems


def load_train_config(data: Any, source: str = "train", *, check_paths: bool = True) -> TrainConfig:
    """The train section; with check_paths, the model and prompt data it names must exist."""
    cfg = validate_section(TrainConfig, data, source, TrainConfigError)
    if check_paths and (missing := cfg.missing_paths()):
        raise TrainConfigError("\n".join(f"{source}: {problem}" for problem in missing))
    return cfg


class SFTConfig(BaseModel):
    """`agentrl sft`'s settings (agentrl/train/sft.py)."""

    model_config = ConfigDict(extra="forbid")

    model: Path
    out: Path
    epochs: int = Field(default=3, gt=0)
    lr: float = Field(default=1e-4, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    max_tokens_per_step: int = Field(default=8192, gt=0)
    min_reward: float | None = None     # keep only samples whose attempt earned at least this
    seed: int = 0
    # What TorchPolicy reads of a trainer's config: plain log-probs, no reference model.
    rollout_temperature: float = 1.0
    kl_coef: float = 0.0
    routing_replay: bool = False
