"""What a task family makes: a Draft, one task before it is a Harbor directory.

A family is a function of a `random.Random` alone, so a task is a function of the stream it
is drawn from (`agentrl.swe.generate` seeds one per family, split, seed and index). It knows
its bug, so it says which hidden tests fail before the fix (FAIL_TO_PASS) and which pass
before and after (PASS_TO_PASS); the generator checks both by running them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class GenerationError(ValueError):
    """A task that cannot be made, or whose tests do not tell the fix from the bug; names the task."""


@dataclass(frozen=True)
class Draft:
    # What makes the task the task it is (template, bug, constants; not the names it was given):
    # the split a task belongs to and the duplicates within a set are decided by it.
    key: str
    instruction: str
    repo: dict[str, bytes]        # the buggy repository, path -> bytes; its tests under tests/
    fixed: dict[str, bytes]       # the files the fix rewrites, whole
    hidden: dict[str, bytes]      # the verifier's own test files, tests/<name>
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]  # the repository's tests included
    description: str
    metadata: dict[str, str] = field(default_factory=dict)   # into task.toml's [metadata]
    # The bug as one replacement in `fixed`: (the text the fix restores, the bug's text). The family's
    # own knowledge, never written into the task; a family that gives hints builds them from it.
    edit: tuple[str, str] | None = None
