"""The training sample: one chain of an attempt's model calls, its reward, and what was recorded of both.

The adapter records a session's chains (`agentrl.adapter.trajectory.Chain`); once the attempt is
graded the pool makes each a `Sample` (`Chain.to_sample`, the one place that does) and writes the
attempt's samples as one buffer shard through `SAMPLE_CODEC`. The trainer, sft, eval and the
rollout metrics read them back through the same codec:

    write_shard(buffer_dir, claim, samples, SAMPLE_CODEC)
    read_rollout(ledger, buffer_dir, rollout_id, SAMPLE_CODEC)   # {group: [Sample, ...]}

Arrays are stored exactly: tokens int32, loss_mask uint8, rollout_log_probs float32 and
token_versions int32 (hpc.buffer keeps dtype and bytes). The metadata is typed (`SampleMetadata`):
a field that was not recorded is None, and a record with a field this version does not know is
refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hpc.validation import problems

from .harness.empty_patch import EmptyPatchClass

_ARRAYS = {"tokens": np.int32, "loss_mask": np.uint8, "rollout_log_probs": np.float32, "token_versions": np.int32}
UNKNOWN_VERSION = -1     # in token_versions: not the model's token (prompt, tool output), or no version reported
ROUTE_DTYPE = np.int16   # expert ids: up to 32767 experts, half of SGLang's int32 on disk


class AttemptMetadata(BaseModel):
    """What the pool records of one attempt (agentrl.pool.attempt); None where it was not recorded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    harness: str | None = None
    task: str | None = None                    # the task's instance_id
    exit_code: int | None = None               # the agent CLI's
    agent_timed_out: bool | None = None
    empty_patch: EmptyPatchClass | None = None
    patch_bytes: int | None = None
    # The sandbox limits the attempt ran into (hpc.sandbox.usage.LIMITS: memory, pids, storage, tmp, time)
    limits: tuple[str, ...] = ()
    turns: int | None = None                   # model calls of the whole attempt
    branches: int | None = None                # turns mounted under a turn that had a child: a chain each
    drift: dict[str, int] = Field(default_factory=dict)   # the attempt's turns by mount (Drift values)
    tool_calls: int | None = None
    # The phases' lengths in seconds (rounded to ms), each from before its bound was taken: queueing included.
    boot_s: float | None = None
    agent_s: float | None = None
    grade_s: float | None = None
    adapter_s: float | None = None             # the adapter's own time over the attempt's turns, the model's excluded

    def timings(self) -> dict[str, float]:
        """The phase lengths that were recorded, by name (boot_s, agent_s, grade_s)."""
        phases = {"boot_s": self.boot_s, "agent_s": self.agent_s, "grade_s": self.grade_s}
        return {name: s for name, s in phases.items() if s is not None}


class SampleMetadata(AttemptMetadata):
    """A sample's metadata: its attempt's (the same in each of the attempt's samples) and its own chain's."""

    chain_turns: int | None = None             # turns on the sample's chain, trained here or in a sibling
    trained_tokens: int | None = None
    weight_version: int | None = None          # the newest of the trained turns' weight versions (token_versions)
    truncated: bool | None = None              # the chain's last turn stopped at its token limit
    ill_formed_turns: int | None = None        # trained turns whose output did not parse


@dataclass
class Sample:
    """One training sample: prompt + response tokens, and per-response-token mask and log-probs."""

    tokens: np.ndarray
    response_length: int
    loss_mask: np.ndarray
    rollout_log_probs: np.ndarray
    reward: float
    status: str
    group_index: int
    attempt: int
    metadata: SampleMetadata = field(default_factory=SampleMetadata)
    # Per response token, the weight version of the model that generated it (UNKNOWN_VERSION where none did,
    # or none was reported): an agent's session may span a weight update. Left empty: all unknown (older shards).
    token_versions: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    # An MoE's routes for routing replay (hpc.inference.routing): per position of `tokens`, the experts the
    # sampler sent it to in each layer, [len(tokens), layers x top_k] (NO_ROUTE where none was recorded).
    # None: not recorded (a dense model, or the adapter's return_routed_experts off).
    routed_experts: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not len(self.token_versions):
            self.token_versions = np.full(max(0, int(self.response_length)), UNKNOWN_VERSION, np.int32)
        for name, dtype in _ARRAYS.items():
            setattr(self, name, np.asarray(getattr(self, name), dtype=dtype))
        if self.routed_experts is not None:
            self.routed_experts = np.asarray(self.routed_experts, dtype=ROUTE_DTYPE)
        # Plain Python numbers, whatever the caller computed them with: what a shard record holds.
        self.response_length, self.group_index, self.attempt = (
            int(self.response_length), int(self.group_index), int(self.attempt))
        self.reward = float(self.reward)
        wrong = []
        if self.tokens.ndim != 1:
            wrong.append("tokens must be 1-D")
        if not 0 <= self.response_length <= len(self.tokens):
            wrong.append(f"response_length {self.response_length} is outside 0..{len(self.tokens)}")
        for name in ("loss_mask", "rollout_log_probs", "token_versions"):
            if len(getattr(self, name)) != self.response_length:
                wrong.append(f"{name} has {len(getattr(self, name))} entries, "
                                f"response_length is {self.response_length}")
        routes = self.routed_experts
        if routes is not None and (routes.ndim != 2 or len(routes) != len(self.tokens)):
            wrong.append(f"routed_experts has shape {routes.shape}, not one row per token ({len(self.tokens)})")
        if not isinstance(self.metadata, SampleMetadata):
            wrong.append(f"metadata must be a SampleMetadata, not {type(self.metadata).__name__}")
        if wrong:
            raise ValueError("invalid sample: " + "; ".join(wrong))

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length


class SampleCodec:
    """Samples as hpc.buffer records: the arrays as they are, the metadata in its JSON form."""

    def to_record(self, item: Sample) -> dict[str, Any]:
        return {"tokens": item.tokens, "response_length": item.response_length, "loss_mask": item.loss_mask,
                "rollout_log_probs": item.rollout_log_probs, "token_versions": item.token_versions,
                "reward": item.reward, "status": item.status,
                "group_index": item.group_index, "attempt": item.attempt,
                "metadata": item.metadata.model_dump(mode="json"),
                # absent rather than None: a shard written before routes existed reads the same
                **({} if item.routed_experts is None else {"routed_experts": item.routed_experts})}

    def from_record(self, record: dict[str, Any]) -> Sample:
        try:
            metadata = SampleMetadata.model_validate(record["metadata"])
        except ValidationError as e:
            raise ValueError("; ".join(f"metadata.{field}: {msg}" for field, msg in
                                       problems(e, unknown_key="not a field of this version's metadata"))) from None
        # A missing or unknown field of the sample is a TypeError, an inconsistent one a ValueError.
        return Sample(**{**record, "metadata": metadata})

    def attempt_of(self, item: Sample) -> tuple[int, int]:
        return item.group_index, item.attempt


SAMPLE_CODEC = SampleCodec()
