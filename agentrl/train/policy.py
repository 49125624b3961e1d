"""What the training loop (agentrl/train/loop.py) asks of a backend: exactly the members it uses.

TorchPolicy (torch_backend.py) and MegatronPolicy (megatron_backend.py) satisfy it structurally;
mypy checks both where the loop builds them (Trainer.make_policy), and tests/test_train_policy.py
checks each backend has every member.
"""

from __future__ import annotations

from typing import Protocol

from .batch import RolloutBatch, StepPlan
from .checkpoint import Saveable


class Policy(Saveable, Protocol):
    """A trainable policy: one optimizer step per StepPlan, its state saved, loaded and exported
    (Saveable: save, load, export_hf) by agentrl/train/checkpoint.py."""

    steps: int      # optimizer steps taken; the loop sets it from a resumed checkpoint

    @property
    def collective_io(self) -> bool:
        """save and export_hf are collective (every rank calls them), else rank 0 alone does."""
        ...

    @property
    def dp_rank(self) -> int:
        """This process's data-parallel rank: which of a step's micro-batches it trains on."""
        ...

    @property
    def dp_size(self) -> int:
        ...

    def train_step(self, batch: RolloutBatch, plan: StepPlan) -> dict[str, float]:
        """One optimizer step over this rank's micro-batches of `plan`; metrics summed over data-parallel ranks."""
        ...

    def fingerprint(self) -> str:
        """A hash of this rank's parameters: replicas that agree on it hold the same model."""
        ...
