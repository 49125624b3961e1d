"""Task families for `agentrl tasks generate`: name -> a function of a random.Random that makes a Draft.

A new family is a module here with a `draw(rng) -> Draft` and one line in FAMILIES; the
generator (agentrl/swe/generate.py) does the rest: seeds, splits, duplicates, the Harbor
layout and grader, the check on the host, the atomic write.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from . import pyfix, pyfix_hint
from .base import Draft, GenerationError

FAMILIES: dict[str, Callable[[random.Random], Draft]] = {
    "pyfix": pyfix.draw,
    "pyfix-hint": pyfix_hint.draw,
}

__all__ = ["FAMILIES", "Draft", "GenerationError"]
