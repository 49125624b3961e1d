"""The pyfix-hint family: a pyfix task whose instruction also says which line to change, and to what.

The family for showing, on 2 cores, that the loop learns (`make learn`). The instruction ends with
the command that makes the repair, `sed -i 'Ns/BAD/GOOD/' PATH`. A model of a million parameters
trained for minutes learns neither to find a bug nor to copy a span of its context (docs/learning.md
has the measurements), so what a policy learns here is the agent's part: read the task, run its
fix, look at the code, run the tests, stop, where its teacher forgets the fix or only prints it
half the time; the verifier's per-test results are the only reward.

Only the pyfix bugs that are one replacement on one line, in text that sed's basic regular
expressions and a single-quoted shell word take literally, qualify; a draw that does not is drawn
again from the same stream, so a task is still a function of it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace

from . import pyfix
from .base import Draft, GenerationError

HINT = "On line {line} of `{path}`, `{bad}` should be `{good}`: `{sed}` makes the fix.\n"
# Text that sed's pattern and replacement, a single-quoted shell word and the hint's backquotes all
# take as it is.
LITERAL = re.compile(r"[^\[\]*.^$\\/&'\"`\n]+")
MAX_REDRAWS = 200


@dataclass(frozen=True)
class Hint:
    line: int          # 1-based, in the buggy file
    path: str
    bad: str           # the bug's text, found once on that line
    good: str          # what it should be

    def sed(self) -> str:
        """The one command that makes the fix."""
        return f"sed -i '{self.line}s/{self.bad}/{self.good}/' {self.path}"


def hint_of(draft: Draft) -> Hint | None:
    """The draft's bug as a one-line sed replacement, or None when it is not one."""
    if draft.edit is None or len(draft.fixed) != 1:
        return None
    good, bad = draft.edit
    (path, fixed), = draft.fixed.items()
    before, after = draft.repo[path].decode().splitlines(), fixed.decode().splitlines()
    if len(before) != len(after):
        return None
    changed = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if b != a]
    if len(changed) != 1 or not all(LITERAL.fullmatch(s) for s in (bad, good)):
        return None
    i = changed[0]
    if before[i].count(bad) != 1 or before[i].replace(bad, good) != after[i]:
        return None
    return Hint(i + 1, path, bad, good)


def draw(rng: random.Random) -> Draft:
    """A pyfix draw whose bug is a one-line replacement, with the hint appended to its instruction."""
    for _ in range(MAX_REDRAWS):
        draft = pyfix.draw(rng)
        hint = hint_of(draft)
        if hint is not None:
            text = HINT.format(line=hint.line, path=hint.path, bad=hint.bad, good=hint.good, sed=hint.sed())
            return replace(draft, instruction=draft.instruction + text,
                           metadata={**draft.metadata, "hint_line": str(hint.line)})
    raise GenerationError(f"{MAX_REDRAWS} pyfix draws in a row had no one-line bug: the templates changed")
