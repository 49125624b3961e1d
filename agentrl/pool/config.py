"""The pool role's configuration (the `pool:` section of a run config), validated in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hpc.validation import validate_section

from ..adapter.settings import AdapterSettings
from ..harness import check_harness, get_harness


class PoolConfigError(ValueError):
    pass


MOVED_TO_ADAPTER = ("max_context", "max_new_tokens", "tool_parser", "reasoning_parser", "model_name")


def moved_to_adapter(section: Any) -> list[str]:
    """The keys of a pool section written before they moved under `adapter:` (agentrl launch says so)."""
    return [k for k in MOVED_TO_ADAPTER if k in section] if isinstance(section, dict) else []


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # claude_code | qwen_code | codex | opencode | gemini_cli | openhands | mini_swe_agent[_text] | codebuddy | builtin
    harness: str = "builtin"
    prompt_style: Literal["instruction", "dataset"] = "instruction"
    runtime: Literal["bwrap", "apptainer", "local"] = "bwrap"
    allow_unsafe_local: bool = False
    image_cache: Path | None = None               # where `agentrl images build` put the task images
    scratch_dir: Path | None = None               # node-local disk for sandbox layers
    # what holds a sandbox's writable layers and HOME, sized to the task's storage_mb (docs/sandbox.md):
    # auto: a disk image on scratch_dir where the node has loop devices, else tmpfs (RAM), said once
    sandbox_storage: Literal["auto", "disk", "tmpfs"] = "auto"
    tools_dir: Path | None = None     # host tools dir (harness installs); default ~/.cache/agentrl/tools
    max_agents: int = Field(default=4, gt=0)      # agents running at once
    max_booting: int = Field(default=2, gt=0)     # sandboxes booting and grading at once
    lease_s: float = Field(default=120.0, gt=5)
    poll_s: float = Field(default=1.0, gt=0)
    # the model, as the adapter serves it to the agents
    # the trainer's log-probs are at train.rollout_temperature: sampling at any other makes every PPO
    # ratio wrong, so this may only repeat it (sampling(), below)
    temperature: float | None = Field(default=None, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    # the adapter the agents talk to: parsers, context, per-turn budget, the model's name, request limits
    adapter: AdapterSettings = Field(default_factory=AdapterSettings)
    compact_at: float = Field(default=0.6, gt=0, le=1)
    # the attempt
    agent_timeout_s: float | None = Field(default=None, gt=0)   # default: the task's own
    # isolated: the patch is graded in a fresh sandbox of the task, so nothing the agent did
    # outside its patch can reach the grader (docs/sandbox.md, "Grading modes").
    grading: Literal["same", "isolated"] = "isolated"
    empty_patch_policy: Literal["off", "metrics", "abort"] = "metrics"
    extra_args: list[str] = Field(default_factory=list)
    extra_env: dict[str, str] = Field(default_factory=dict)

    @field_validator("harness")
    @classmethod
    def _known_harness(cls, name: str) -> str:
        get_harness(name)      # its ValueError names the known ones
        return name

    @model_validator(mode="before")
    @classmethod
    def _moved_to_adapter(cls, data: Any) -> Any:
        """The adapter's keys once sat in pool: directly; a run made then keeps them so in its run.yaml."""
        moved = moved_to_adapter(data)
        adapter = data.get("adapter") if moved else None
        if not moved or not isinstance(adapter, dict | None):
            return data
        if clash := [k for k in moved if k in (adapter or {})]:
            raise ValueError(f"{clash[0]} given twice, in pool: and in pool.adapter: keep adapter.{clash[0]} alone")
        return {**{k: v for k, v in data.items() if k not in moved},
                "adapter": {**(adapter or {}), **{k: data[k] for k in moved}}}

    @model_validator(mode="after")
    def _budget(self) -> PoolConfig:
        if self.adapter.max_new_tokens is None:
            raise ValueError("adapter.max_new_tokens: the agents need a per-turn budget (default 4096), not None")
        if self.adapter.max_new_tokens >= self.adapter.max_context:
            raise ValueError(f"adapter.max_new_tokens {self.adapter.max_new_tokens} must be below "
                             f"adapter.max_context {self.adapter.max_context}")
        check_harness(self.harness, self.adapter.max_context)    # the window it needs
        return self

    def sampling(self, rollout_temperature: float) -> dict[str, float | int]:
        """The sampling parameters the adapter passes to inference, at the trainer's temperature.

        Raises PoolConfigError if pool.temperature says otherwise."""
        if self.temperature is not None and self.temperature != rollout_temperature:
            raise PoolConfigError(f"pool.temperature {self.temperature} differs from train.rollout_temperature "
                                  f"{rollout_temperature}, at which the trainer computes the sampler's log-probs: "
                                  "every importance ratio would be wrong. Remove pool.temperature and set "
                                  "train.rollout_temperature")
        assert self.adapter.max_new_tokens is not None     # _budget
        return {"temperature": rollout_temperature, "top_p": self.top_p,
                "max_new_tokens": self.adapter.max_new_tokens}


def load_pool_config(data: Any, source: str = "pool") -> PoolConfig:
    return validate_section(PoolConfig, data or {}, source, PoolConfigError)
