"""What the viewer shows, as plain data: where an attempt's files are, its row, a listing's figures.

Pure: no file is read here (read.py does that). A row is what a listing shows of one attempt, made
from its samples' metadata (a rollout's) or its result (an eval's); it is kept in the output
directory's manifest as JSON, so that a listing of thousands of attempts is rewritten without
reading their shards again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..pool.metrics import pass_at_k
from ..pool.trace import AttemptTrace
from ..sample import Sample

Kind = Literal["rollout", "eval"]


@dataclass(frozen=True)
class AttemptRef:
    """One committed attempt and its files (None: there is none of that kind)."""

    kind: Kind
    number: int                  # the rollout id, or the eval's checkpoint iteration
    generation: int
    group: int
    attempt: int
    try_index: int
    shard: Path | None           # its samples (hpc.buffer)
    trace: Path | None           # agentrl.pool.trace
    result: Path | None = None   # an eval's attempts/<g>-<a>-<try>.json

    @property
    def page(self) -> str:
        return f"{self.group}-{self.attempt}.html"

    @property
    def title(self) -> str:
        where = f"rollout {self.number}" if self.kind == "rollout" else f"eval iter_{self.number}"
        return f"{where}, group {self.group}, attempt {self.attempt}"

    def inputs(self) -> list[Path]:
        return [p for p in (self.shard, self.trace, self.result) if p is not None]


@dataclass(frozen=True)
class AttemptRow:
    """One attempt as a listing shows it; None where nothing recorded it."""

    page: str
    group: int
    attempt: int
    try_index: int
    task: str | None = None
    reward: float | None = None
    harness: str | None = None
    exit_code: int | None = None
    agent_timed_out: bool | None = None
    empty_patch: str | None = None
    patch_bytes: int | None = None
    limits: tuple[str, ...] = ()        # the sandbox limits it ran into ("limit: memory" on its page)
    turns: int | None = None
    tool_calls: int | None = None
    samples: int | None = None
    trained_tokens: int | None = None
    weight_versions: tuple[int, int] | None = None
    drift: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttemptRow:
        versions = data.get("weight_versions")
        return cls(**{**data, "weight_versions": tuple(versions) if versions else None,
                      "limits": tuple(data.get("limits", ())), "problems": tuple(data.get("problems", ()))})


@dataclass
class Attempt:
    """One attempt, read: its samples (in its shard's order), its trace and its eval result."""

    ref: AttemptRef
    samples: list[Sample] = field(default_factory=list)
    trace: AttemptTrace | None = None
    result: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)    # files that could not be read, said for the page


def attempt_row(a: Attempt) -> AttemptRow:
    """The row of an attempt: its samples' metadata (the same in each), else its eval result, else its trace."""
    ref, result = a.ref, a.result or {}
    md = a.samples[0].metadata if a.samples else None
    reward = a.samples[0].reward if a.samples else result.get("reward")
    if reward is None and a.trace is not None and a.trace.grade is not None:
        reward = a.trace.grade.reward
    versions = [s.metadata.weight_version for s in a.samples if s.metadata.weight_version is not None]
    tokens = [s.metadata.trained_tokens for s in a.samples if s.metadata.trained_tokens is not None]
    timings = md.timings() if md else {k: float(v) for k, v in (result.get("timings") or {}).items()}

    def pick(name: str) -> Any:
        value = getattr(md, name, None) if md is not None else None
        return result.get(name) if value is None else value

    empty = pick("empty_patch")
    return AttemptRow(
        page=ref.page, group=ref.group, attempt=ref.attempt, try_index=ref.try_index,
        task=pick("task") or (a.trace.task if a.trace else None), reward=reward, harness=pick("harness"),
        exit_code=pick("exit_code"), agent_timed_out=pick("agent_timed_out"),
        empty_patch=getattr(empty, "value", empty), patch_bytes=pick("patch_bytes"), turns=pick("turns"),
        limits=tuple(pick("limits") or (a.trace.limits if a.trace else ())),
        tool_calls=pick("tool_calls"), samples=len(a.samples) if a.samples else None,
        trained_tokens=sum(tokens) if tokens else None,
        weight_versions=(min(versions), max(versions)) if versions else None,
        drift=dict(md.drift) if md else {}, timings=timings, problems=tuple(a.problems))


@dataclass(frozen=True)
class Figures:
    """A listing's figures: of a rollout or an eval, from its attempts' rows."""

    attempts: int
    reward_mean: float | None
    pass_at_1: float | None
    pass_at_k: float | None
    k: int | None
    empty_patch_rate: float | None
    drift: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def figures(rows: list[AttemptRow]) -> Figures:
    """reward mean, pass@1 (reward > 0), pass@k over the tasks with k attempts (k: the most any task has),
    the empty-patch rate (a class other than not_triggered), and the drift counts summed."""
    rewards = [r.reward for r in rows if r.reward is not None]
    by_task: dict[str, list[float]] = {}
    for r in rows:
        if r.reward is not None and r.task is not None:
            by_task.setdefault(r.task, []).append(r.reward)
    k = max((len(v) for v in by_task.values()), default=0)
    full = [v for v in by_task.values() if len(v) == k]
    classes = [r.empty_patch for r in rows if r.empty_patch is not None]
    drift: dict[str, int] = {}
    for r in rows:
        for name, n in r.drift.items():
            drift[name] = drift.get(name, 0) + n
    return Figures(
        attempts=len(rows), reward_mean=sum(rewards) / len(rewards) if rewards else None,
        pass_at_1=sum(x > 0 for x in rewards) / len(rewards) if rewards else None,
        pass_at_k=sum(pass_at_k(k, sum(x > 0 for x in v), k) for v in full) / len(full) if full and k > 1 else None,
        k=k if k > 1 else None,
        empty_patch_rate=sum(c != "not_triggered" for c in classes) / len(classes) if classes else None,
        drift=drift)
