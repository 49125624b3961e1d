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


# sed's basic regular expression and its replacement take these characters as syntax: escaped, they
# are themselves (a one-line hint of another family, agentrl/swe/mutate/issue.py, may hold them)
_PATTERN_SPECIAL = re.compile(r"([\\\[\]*.^$/])")
_REPLACEMENT_SPECIAL = re.compile(r"([\\&/])")
# What a hint cannot carry: its backquotes end at a backquote, and sed's s/// is one line
UNSAYABLE = re.compile(r"[`\n\r]")
SAFE_PATH = re.compile(r"[\w./-]+")


@dataclass(frozen=True)
class Hint:
    line: int          # 1-based, in the buggy file
    path: str
    bad: str           # the bug's text, found once on that line
    good: str          # what it should be

    def sed(self) -> str:
        """The one command that makes the fix; the text of the pyfix-hint family needs no escape."""
        pattern, replacement = _PATTERN_SPECIAL.sub(r"\\\1", self.bad), _REPLACEMENT_SPECIAL.sub(r"\\\1", self.good)
        script = f"{self.line}s/{pattern}/{replacement}/".replace("'", "'\\''")    # inside single quotes
        return f"sed -i '{script}' {self.path}"

    def text(self) -> str:
        """The sentence that ends the instruction."""
        return HINT.format(line=self.line, path=self.path, bad=self.bad, good=self.good, sed=self.sed())


def line_hint(path: str, buggy: str, fixed: str, bad: str, good: str) -> Hint | None:
    """`bad` -> `good` as the one change between two texts, on one line where `bad` is once; else None."""
    if not bad or UNSAYABLE.search(bad + good + path) or not SAFE_PATH.fullmatch(path):
        return None
    before, after = buggy.splitlines(), fixed.splitlines()
    if len(before) != len(after):
        return None
    changed = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if b != a]
    if len(changed) != 1:
        return None
    i = changed[0]
    if before[i].count(bad) != 1 or before[i].replace(bad, good) != after[i]:
        return None
    return Hint(i + 1, path, bad, good)


def hint_of(draft: Draft) -> Hint | None:
    """The draft's bug as a one-line sed replacement of text sed takes literally, or None when it is not one."""
    if draft.edit is None or len(draft.fixed) != 1:
        return None
    good, bad = draft.edit
    (path, fixed), = draft.fixed.items()
    if not all(LITERAL.fullmatch(s) for s in (bad, good)):
        return None
    return line_hint(path, draft.repo[path].decode(), fixed.decode(), bad, good)


def draw(rng: random.Random) -> Draft:
    """A pyfix draw whose bug is a one-line replacement, with the hint appended to its instruction."""
    for _ in range(MAX_REDRAWS):
        draft = pyfix.draw(rng)
        hint = hint_of(draft)
        if hint is not None:
            return replace(draft, instruction=draft.instruction + hint.text(),
                           metadata={**draft.metadata, "hint_line": str(hint.line)})
    raise GenerationError(f"{MAX_REDRAWS} pyfix draws in a row had no one-line bug: the templates changed")
