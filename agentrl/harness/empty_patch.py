"""The empty-patch guard: why did an agent that exited 0 change nothing?

Some CLIs treat a text-only final turn as the finished answer: the model says "Let me look at the
tests." and the CLI exits 0 with an empty diff. Every exit-0, empty-patch rollout is classified from
the harness's own trajectory:

    mid_task_narration  the final text announces an action it never took ("Let me ...", "I'll now ...")
    claimed_completion  the final text says the work is done ("fixed", "the issue is resolved")
    no_final_text       there is no final text at all
    unclassified        there is text, and it says neither
    not_triggered       exit != 0, a non-empty patch, or an unreadable trajectory (never an exception)

Narration is looked for in the last two sentences only: a text that ends by announcing its next step
was cut off mid-task, whatever it claimed before ("I fixed the import. Now let me run the tests.").
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Literal

from .base import Trajectory


class EmptyPatchClass(str, Enum):
    NOT_TRIGGERED = "not_triggered"
    MID_TASK_NARRATION = "mid_task_narration"
    CLAIMED_COMPLETION = "claimed_completion"
    NO_FINAL_TEXT = "no_final_text"
    UNCLASSIFIED = "unclassified"


class EmptyPatchPolicy(str, Enum):
    OFF = "off"            # not even counted
    METRICS = "metrics"    # label and count; the sample trains with its zero reward: a real negative
    ABORT = "abort"        # the attempt is retried instead of trained, where the CLI cut the episode short


NARRATION = [re.compile(p, re.I) for p in (
    r"\blet me\b(?! know)",                               # "Let me check", not "let me know if ..."
    r"\blet's\b",
    r"\bi(?:'ll| will| am going to|'m going to| need to| should)\b",
    r"\b(?:next|now|first|then),? (?:i|we)\b",            # "Next, I ...", "Now I ..."
    r"\b(?:i|we) (?:can|could) now\b",
    r":\s*$",                                             # "Let me look at the file:" and nothing follows
)]
COMPLETION = [re.compile(p, re.I) for p in (
    r"\b(?:fixed|resolved|implemented|completed?|done|finished|addressed)\b",
    r"\b(?:has|have) been (?:updated|changed|added|modified|applied|corrected)\b",
    r"\bi(?:'ve| have) (?:made|updated|changed|added|modified|applied|corrected)\b",
    r"\bsuccessfully\b",
    r"\b(?:tests?|everything) (?:now )?pass(?:es)?\b",
    r"\bshould now (?:work|pass|behave)\b",
)]
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def last_sentences(text: str, n: int = 2) -> str:
    parts = [p for p in _SENTENCE_END.split(text.strip()) if p.strip()]
    return " ".join(parts[-n:])


def classify_empty_patch(exit_code: int, patch_empty: bool, trajectory: Trajectory) -> EmptyPatchClass:
    if exit_code != 0 or not patch_empty or not trajectory.raw_ok:
        return EmptyPatchClass.NOT_TRIGGERED
    text = (trajectory.final_text or "").strip()
    if not text:
        return EmptyPatchClass.NO_FINAL_TEXT
    ending = last_sentences(text)
    if any(p.search(ending) for p in NARRATION):
        return EmptyPatchClass.MID_TASK_NARRATION
    if any(p.search(text) for p in COMPLETION):
        return EmptyPatchClass.CLAIMED_COMPLETION
    return EmptyPatchClass.UNCLASSIFIED


# Under `abort`, only what the CLI cut short is retried: narration (the model meant to go on) and no
# final text (it said nothing and the CLI took that as an answer). A claimed completion, or any other
# answer, is the model's own decision to stop, and its zero reward is the lesson.
RETRIED_UNDER_ABORT = frozenset({EmptyPatchClass.MID_TASK_NARRATION, EmptyPatchClass.NO_FINAL_TEXT})


def decide(policy: EmptyPatchPolicy | str, cls: EmptyPatchClass | str) -> Literal["train", "retry"]:
    policy, cls = EmptyPatchPolicy(policy), EmptyPatchClass(cls)
    if policy is EmptyPatchPolicy.ABORT and cls in RETRIED_UNDER_ABORT:
        return "retry"
    return "train"
