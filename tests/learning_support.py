"""What the learning tests share: loading the bench and fixture tools, which are scripts, not a package, and
the skip both GRPO tests need."""

import importlib.util
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]

NEEDS_SANDBOX = pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                   reason="needs bubblewrap (make sysdeps) and root for overlay mounts")


def load(path: str) -> ModuleType:
    """The script at path (from the project's root) as a module."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    assert spec and spec.loader, f"{path}: not a Python file"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
