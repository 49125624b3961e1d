"""Small runs for the viewer's tests, written by the project's own writers.

Each attempt is a real session: ChatML turns (a system and a user prompt, a tool call, its result, a
final text) go through a TrajectoryTree; its chains become samples (Chain.to_sample), its shard is
written by hpc.buffer, its trace by agentrl.pool.trace, and the ledger commits it, as the pool does.
An attempt may fork (a last turn that continues no earlier one: a second sample) or retry its last call
(a branch: a second sample whose shared trunk is trained in the first). The tokens come from
`encode`: the tiny model's tokenizer, or CharTokenizer below where no model is needed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentrl.adapter.trajectory import TrajectoryTree, Turn
from agentrl.harness.base import Trajectory
from agentrl.harness.empty_patch import EmptyPatchClass
from agentrl.pool.attempt import AttemptOutcome
from agentrl.pool.trace import trace_path, write_trace
from agentrl.sample import SAMPLE_CODEC, AttemptMetadata
from agentrl.swe.episode import Grade
from hpc.buffer import write_shard
from hpc.ledger import Claim, Ledger
from hpc.runlayout import RunLayout
from hpc.sandbox.base import ExecResult

Encode = Callable[[str], list[int]]
SYSTEM = "You are a software engineering agent. Use the bash tool."


class CharTokenizer:
    """One id per character (256 + its code point), and one per ChatML marker: enough to decode exactly."""

    SPECIAL = ("<|im_start|>", "<|im_end|>")
    _SPLIT = re.compile("(" + "|".join(map(re.escape, SPECIAL)) + ")")

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in self._SPLIT.split(text):
            ids.extend([self.SPECIAL.index(part)] if part in self.SPECIAL else [256 + ord(c) for c in part])
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(self.SPECIAL[i] if i < len(self.SPECIAL) else chr(i - 256) for i in ids)


@dataclass(frozen=True)
class Script:
    """What one attempt's agent does and gets."""

    task: str
    command: str = "cat a.py"
    tool_output: str = "def f():\n    return 1\n[exit code 0]"
    final: str = "Fixed it."
    reward: float = 1.0
    patch: str = ("diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1,2 +1,2 @@\n def f():\n"
                  "-    return 1\n+    return 2\n")
    grade_output: str = "grade.py: 2 of 2 named tests ok\nreward 1\n"
    fork: bool = False
    retry: bool = False         # the last call again, answered otherwise: a branch (a second sample sharing the trunk)
    weight_version: int = 3
    limits: tuple[str, ...] = ()   # the sandbox limits it ran into


def chatml(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def turns_of(script: Script, encode: Encode) -> list[Turn]:
    prompt = encode(chatml("system", SYSTEM) + chatml("user", f"Solve {script.task}.") + "<|im_start|>assistant\n")
    call = encode(f"<think>\nLook first.\n</think>\n\n<tool_call>\n<function=bash>\n<parameter=command>\n"
                  f"{script.command}\n</parameter>\n</function>\n</tool_call><|im_end|>")
    second = [*prompt, *call, *encode("\n" + chatml("user", f"<tool_response>\n{script.tool_output}\n</tool_response>")
                                      + "<|im_start|>assistant\n")]
    done = encode(f"{script.final}<|im_end|>")

    def turn(p: list[int], out: list[int]) -> Turn:
        return Turn(p, out, [-0.25 - (i % 7) / 10 for i in range(len(out))], "stop",
                    weight_version=script.weight_version)

    turns = [turn(prompt, call), turn(second, done)]
    if script.retry:
        turns.append(turn(second, encode(f"Retried: {script.final}<|im_end|>")))
    if script.fork:     # a compacted history: the system prompt and a summary, continuing nothing
        turns.append(turn(encode(chatml("system", SYSTEM) + chatml("user", "Summary so far.")
                                 + "<|im_start|>assistant\n"), encode("Done.<|im_end|>")))
    return turns


def commit_attempt(run: RunLayout, ledger: Ledger, claim: Claim, script: Script, encode: Encode) -> None:
    """The attempt of `claim` as the pool leaves it: shard, trace, commit."""
    tree = TrajectoryTree()
    for t in turns_of(script, encode):
        tree.add(t)
    chains = tree.samples()
    patch = script.patch.encode()
    metadata = AttemptMetadata(
        harness="builtin", task=script.task, exit_code=0, agent_timed_out=False,
        empty_patch=EmptyPatchClass.NOT_TRIGGERED if patch else EmptyPatchClass.NO_FINAL_TEXT,
        patch_bytes=len(patch), limits=script.limits, turns=tree.turns, branches=tree.branches,
        drift={d.value: n for d, n in tree.counts.items()}, tool_calls=1, boot_s=0.5, agent_s=2.0, grade_s=0.25)
    samples = [c.to_sample(reward=script.reward, group_index=claim.group, attempt=claim.attempt, metadata=metadata)
               for c in chains]
    outcome = AttemptOutcome(
        samples, script.reward, metadata, patch=patch,
        grade=Grade(script.reward, 0 if script.reward > 0 else 1, script.grade_output.encode(), 0.25, False),
        agent=ExecResult(0, b'{"final_text": "done"}\n', b"builtin_agent: turn 1: 1 tool call(s)\n", 2.0),
        trajectory=Trajectory(script.final, tree.turns, 1, "stop", True), spans=[c.spans for c in chains])
    assert write_trace(trace_path(run.trajectories_dir, claim), claim, outcome)
    ref = write_shard(run.buffer_dir, claim, samples, SAMPLE_CODEC)
    assert ledger.commit(claim, ref)


def make_rollout(run: RunLayout, rollout_id: int, scripts: dict[tuple[int, int], Script], encode: Encode,
                 *, attempts: int = 2, commit: set[tuple[int, int]] | None = None
                 ) -> tuple[Ledger, dict[tuple[int, int], Claim]]:
    """Open the rollout (its groups as the scripts' keys say) and claim every attempt; commit those in `commit`
    (all of them by default). The others' claims are returned, in flight, for commit_attempt later."""
    ledger = Ledger(run.ledger_dir)
    ledger.open_rollout(rollout_id, sorted({g for g, _ in scripts}), attempts)
    wanted = set(scripts) if commit is None else commit
    pending = {}
    while (claim := ledger.claim("test-worker", rollout_id=rollout_id)) is not None:
        key = (claim.group, claim.attempt)
        if key in wanted:
            commit_attempt(run, ledger, claim, scripts[key], encode)
        else:
            pending[key] = claim
    return ledger, pending


def new_run(root: Path, model: Path | None = None) -> RunLayout:
    return RunLayout.create(root, config={"train": {"model": str(model)} if model else {},
                                          "pool": {"tool_parser": "qwen3_coder", "reasoning_parser": "qwen3"}},
                            run_id="view-test")
