"""The torch backend: a Hugging Face causal LM, DDP over gloo (CPU) or NCCL (GPU), AdamW.

The embedded default and the backend for models that fit one GPU. A micro-batch's samples are
padded into one [batch, length] forward pass (attention masks keep them apart); the tokens a
micro-batch may hold are capped by the schedule (`max_tokens_per_gpu`).
"""

from __future__ import annotations

import hashlib
import shutil
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from hpc.inference import routing

from .batch import RolloutBatch, StepPlan
from .config import SFTConfig, TrainConfig
from .step import grpo_micro_batches, reduce_over_ranks
from .tensors import first_predictor, padded_routes, padded_tokens, response_slices

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "generation_config.json")


def world() -> tuple[int, int]:
    """(rank, world size) of the initialised process group, or (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    if world()[1] > 1:
        dist.barrier()


class TorchPolicy:
    """A Policy (agentrl/train/policy.py); also the warm start's (agentrl/train/sft.py: an SFTConfig, sft_step)."""

    collective_io = False      # rank 0 alone saves: DDP keeps every rank identical

    def __init__(self, model_dir: Path, cfg: TrainConfig | SFTConfig):
        from transformers import AutoModelForCausalLM

        self.cfg, self.model_dir = cfg, Path(model_dir)
        self.rank, self.world_size = world()
        self.dp_rank, self.dp_size = self.rank, self.world_size
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
        torch.manual_seed(cfg.seed)
        # transformers wraps `to` with functools.wraps(Module.to): typeshed's _Wrapped then takes the device for self
        module = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(
            self.device)  # type: ignore[arg-type]
        module.train()
        self.module = module
        self.model = (torch.nn.parallel.DistributedDataParallel(module) if self.world_size > 1 else module)
        self.ref = None
        if cfg.kl_coef > 0:
            self.ref = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(
                self.device)  # type: ignore[arg-type]    # as above
            self.ref.eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.steps = 0

    # ------------------------------------------------------------ forward

    def response_logprobs(self, model: torch.nn.Module, batch: RolloutBatch, indices: list[int]) -> Tensor:
        """Log-probs of each sample's response tokens under `model`, flat over the micro-batch."""
        ids = padded_tokens(batch, indices).to(self.device)
        mask = (torch.arange(ids.shape[1]) < torch.tensor([len(batch.samples[i].tokens) for i in indices])[:, None])
        # Logits (and their log-softmax over the vocabulary, forward and backward) from the first response
        # token's predictor on: an agent's prompt is most of its tokens (benchmarks/train_bench.py (b)).
        first = first_predictor(batch, indices)
        routes = padded_routes(batch, indices) if self.cfg.routing_replay else None
        # Routing replay: an MoE's routers send each token to the experts the sampler did (hpc.inference.routing)
        with nullcontext() if routes is None else routing.replay(model, routes.to(self.device)):
            logits = model(input_ids=ids, attention_mask=mask.long().to(self.device),
                           logits_to_keep=ids.shape[1] - first).logits[:, :-1].float()
        logp = torch.log_softmax(logits / self.cfg.rollout_temperature, dim=-1)
        logp = logp.gather(-1, ids[:, first + 1:, None]).squeeze(-1)
        return response_slices(logp, batch, indices, first)

    # ------------------------------------------------------------ one optimizer step

    def train_step(self, batch: RolloutBatch, plan: StepPlan) -> dict[str, float]:
        cfg = self.cfg
        assert isinstance(cfg, TrainConfig), "train_step takes a TrainConfig's policy (SFT trains with sft_step)"
        self.optimizer.zero_grad(set_to_none=True)
        totals = grpo_micro_batches(
            batch, plan, cfg, self.device, logprobs=lambda model, ix: self.response_logprobs(model, batch, ix),
            policy=self.model, behaviour=self.module, ref=self.ref,
            # DDP averages gradients over ranks; the per-attempt reduction already divides by the step.
            loss_scale=self.world_size,
            accumulating=lambda last: self.model.no_sync() if self.world_size > 1 and not last else nullcontext())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.steps += 1
        return {**reduce_over_ranks(totals, device=self.device), "grad_norm": float(grad_norm),
                "step_samples": plan.samples, "step_tokens": plan.tokens}

    def sft_step(self, batch: RolloutBatch, indices: list[int]) -> dict[str, float]:
        """One optimizer step of cross-entropy on the trained tokens of `indices` (their token mean):
        the warm start (agentrl/train/sft.py), on one process."""
        self.optimizer.zero_grad(set_to_none=True)
        logprobs = self.response_logprobs(self.model, batch, indices)
        mask = torch.cat([torch.from_numpy(batch.samples[i].loss_mask.astype("float32")) for i in indices])
        mask = mask.to(self.device)
        tokens = mask.sum()
        loss = -(logprobs * mask).sum() / tokens
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.steps += 1
        return {"loss": float(loss.detach()), "grad_norm": float(grad_norm), "tokens": float(tokens),
                "samples": len(indices)}

    # ------------------------------------------------------------ state

    def save(self, path: Path) -> None:
        """Model and optimizer state into `path` (rank 0 writes: DDP keeps every rank identical)."""
        torch.save(self.module.state_dict(), path / "model.pt")
        torch.save(self.optimizer.state_dict(), path / "optimizer.pt")

    def load(self, path: Path) -> None:
        self.module.load_state_dict(torch.load(path / "model.pt", map_location=self.device, weights_only=True))
        opt = path / "optimizer.pt"
        if opt.exists():   # an export saved with the optimizer offloaded has none: start it fresh
            self.optimizer.load_state_dict(torch.load(opt, map_location=self.device, weights_only=True))

    def export_hf(self, path: Path) -> None:
        """A Hugging Face directory (weights, config, tokenizer) that inference servers and eval load."""
        self.module.save_pretrained(str(path), safe_serialization=True)
        for name in TOKENIZER_FILES:
            if (self.model_dir / name).exists():
                shutil.copy2(self.model_dir / name, path / name)

    def fingerprint(self) -> str:
        """A hash of the parameters: ranks that agree on it hold the same model."""
        h = hashlib.sha256()
        for name, p in sorted(self.module.state_dict().items()):
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]
