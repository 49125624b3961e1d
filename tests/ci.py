"""Under CI every test this machine can run must run: where a part CI installs is missing, the test fails
there, naming it, and skips elsewhere with the same reason (a laptop without bubblewrap or Slurm)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import ModuleType
from typing import NoReturn

import pytest

# `CI=true`, `CI=1`, `CI=yes` are CI; unset, empty, `0`, `false`, `no`, `off` are not
NOT_CI = ("", "0", "false", "no", "off")


def under_ci(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get("CI", "").strip().lower() not in NOT_CI


def skip_or_fail(what: str, problem: str) -> NoReturn:
    """Fail under CI ("CI must run WHAT: PROBLEM"), skip elsewhere (PROBLEM)."""
    if under_ci():
        pytest.fail(f"CI must run {what}: {problem}", pytrace=False)
    pytest.skip(problem)


def require_module(name: str, what: str, install: str) -> ModuleType:
    """The module, imported; where it is missing, skip_or_fail naming how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        skip_or_fail(what, f"{name} cannot be imported ({e}): {install}")
