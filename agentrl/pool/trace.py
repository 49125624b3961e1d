"""What a run keeps of an attempt beside its samples, for people to read (`agentrl view`): the trace.

The samples hold the tokens that train; the trace holds what they do not: the patch, the grader's
output, how the agent's process ended, and where each sample's turns sit in its tokens and how they
mounted (agentrl.adapter.trajectory.TurnSpan: a realign or a fork, where it happened). Long texts
are kept to their head (the patch) or their tail (outputs), so a trace stays small.

    RUN/trajectories/rollout_<r>/g<gen>/<group>-<attempt>-<try>.json     (the pool; as its shard)
    RUN/eval/iter_<n>/trajectories/<group>-<attempt>-<try>.json          (eval)

One writer per file (the try that ran it), written whole (hpc.records.write_record). A trace is
never read by training: a pool that cannot write one logs it and commits the attempt all the same.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from hpc.ledger import Claim
from hpc.records import Record, write_record

from ..adapter.trajectory import TurnSpan

if TYPE_CHECKING:
    from .attempt import AttemptOutcome

log = logging.getLogger("agentrl.pool")

PATCH_LIMIT = 512 * 1024        # bytes of the patch kept (its head)
OUTPUT_LIMIT = 64 * 1024        # bytes of the grader's output kept (its tail: the summary comes last)
STREAM_LIMIT = 16 * 1024        # bytes of the agent's stdout and stderr kept (their tails)


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Text(_Part):
    """A text as kept: `omitted` bytes of the original were left out (at the end of a head, the start of a tail)."""

    text: str
    omitted: int = 0


class GradeTrace(_Part):
    reward: float
    exit_code: int
    output: Text
    duration_s: float
    timed_out: bool


class AgentTrace(_Part):
    exit_code: int
    timed_out: bool
    stdout: Text
    stderr: Text
    final_text: str | None = None     # what the harness read from the agent's own output
    exit_reason: str | None = None


class SpanTrace(_Part):
    start: int
    generated: int
    kept: int
    drift: str
    trained: bool
    weight_version: int | None = None


class AttemptTrace(Record):
    kind: Literal["attempt_trace"] = "attempt_trace"
    schema_version: int = 1
    rollout_id: int
    generation: int
    group: int
    attempt: int
    try_index: int
    task: str | None = None
    limits: list[str] = []                 # the sandbox limits the attempt ran into (AttemptMetadata.limits)
    patch: Text
    grade: GradeTrace | None = None
    agent: AgentTrace | None = None
    chains: list[list[SpanTrace]] = []     # per sample of the attempt, in its shard's order: its turns


def head(data: bytes, limit: int) -> Text:
    return Text(text=data[:limit].decode("utf-8", errors="replace"), omitted=max(0, len(data) - limit))


def tail(data: bytes, limit: int) -> Text:
    return Text(text=data[-limit:].decode("utf-8", errors="replace") if limit else "",
                omitted=max(0, len(data) - limit))


def spans(chain_spans: tuple[TurnSpan, ...]) -> list[SpanTrace]:
    return [SpanTrace(start=s.start, generated=s.generated, kept=s.kept, drift=s.drift, trained=s.trained,
                      weight_version=s.weight_version) for s in chain_spans]


def trace_path(root: Path | str, claim: Claim, *, per_rollout: bool = True) -> Path:
    """The trace of a claim's try under root: RUN/trajectories (per_rollout) or an eval's trajectories/."""
    base = Path(root)
    if per_rollout:
        base = base / f"rollout_{claim.rollout_id}" / f"g{claim.generation}"
    return base / f"{claim.group}-{claim.attempt}-{claim.try_index}.json"


def attempt_trace(claim: Claim, outcome: AttemptOutcome) -> AttemptTrace:
    """The trace of a claim's attempt, from what run_attempt returned."""
    grade, agent, harness = outcome.grade, outcome.agent, outcome.trajectory
    return AttemptTrace(
        rollout_id=claim.rollout_id, generation=claim.generation, group=claim.group, attempt=claim.attempt,
        try_index=claim.try_index, task=outcome.metadata.task, limits=list(outcome.metadata.limits),
        patch=head(outcome.patch, PATCH_LIMIT),
        grade=None if grade is None else GradeTrace(
            reward=grade.reward, exit_code=grade.exit_code, output=tail(grade.output, OUTPUT_LIMIT),
            duration_s=grade.duration_s, timed_out=grade.timed_out),
        agent=None if agent is None else AgentTrace(
            exit_code=agent.exit_code, timed_out=agent.timed_out, stdout=tail(agent.stdout, STREAM_LIMIT),
            stderr=tail(agent.stderr, STREAM_LIMIT), final_text=harness.final_text if harness else None,
            exit_reason=harness.exit_reason if harness else None),
        chains=[spans(s) for s in outcome.spans])


def write_trace(path: Path, claim: Claim, outcome: AttemptOutcome) -> bool:
    """Write the attempt's trace; False (logged) when it cannot be written: a trace never fails an attempt."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_record(path, attempt_trace(claim, outcome))
    except (OSError, ValueError) as e:
        log.warning("the trace of rollout %d group %d attempt %d was not written (%s): agentrl view shows "
                    "its samples without the patch and the grader's output", claim.rollout_id, claim.group,
                    claim.attempt, e)
        return False
    return True
