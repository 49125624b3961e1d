"""The eval role's configuration (the `eval:` section of a run config), validated in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hpc.inference.sglang import SGLangOptions
from hpc.validation import validate_section

from ..pool.config import PoolConfig


class EvalConfigError(ValueError):
    pass


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: Path                                   # prompt JSONL (agentrl convert harbor) or Harbor task dirs
    n_samples: int = Field(default=4, gt=0)       # attempts per task: pass@1 .. pass@n
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int = Field(default=0, ge=0)            # with the CPU engine, the same seed gives the same results
    # "teacher": the scripted teacher of the pyfix-hint family (agentrl/swe/teacher.py) on the model's
    # tokenizer, to record demonstrations for `agentrl sft` (with save_samples)
    engine: Literal["cpu", "sglang", "teacher"] = "cpu"
    teacher_accuracy: float = Field(default=0.5, ge=0, le=1)
    save_samples: bool = False                    # each attempt's samples as a shard in <out>/samples/
    # engine sglang: how it serves (hpc/inference/sglang.py); eval sets the model, host, port and weight version
    sglang: SGLangOptions = Field(default_factory=SGLangOptions)
    max_tries: int = Field(default=3, gt=0)       # per attempt, for infrastructure failures
    poll_s: float = Field(default=10.0, gt=0)     # --watch: how often to look for new checkpoints
    every: int = Field(default=1, gt=0)           # --watch: score iter_<n> when n is a multiple of this
    # sandboxes, harness and agent, as the pool has them; eval's prompt style is its own
    pool: PoolConfig = Field(default_factory=PoolConfig)


def load_eval_config(data: Any, source: str = "eval") -> EvalConfig:
    return validate_section(EvalConfig, data or {}, source, EvalConfigError)
