"""The tiny offline model as a session fixture; a test module asks for it with `pytest_plugins = ["tiny_assets"]`.

Built once per session, or once per code version when AGENTRL_TEST_CACHE names a directory to keep it in.
"""

from __future__ import annotations

import hashlib
import os
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from agentrl.models import tiny


def tiny_model_dir(tmp_root: Path) -> Path:
    """The tiny model (tokenizer and weights) under tmp_root, built unless an identical build is there."""
    # The directory name hashes everything the build depends on, so a cached build is never stale.
    inputs = [Path(tiny.__file__).read_bytes(), tiny.CHAT_TEMPLATE_PATH.read_bytes(),
              " ".join([sys.version, *(version(p) for p in ("tokenizers", "transformers", "torch"))]).encode()]
    digest = hashlib.sha256(b"\0".join(inputs)).hexdigest()[:16]
    return tiny.make_tiny_model(Path(tmp_root) / f"tiny-model-{digest}")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    cache = os.environ.get("AGENTRL_TEST_CACHE")
    return tiny_model_dir(Path(cache) if cache else tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def tiny_moe_model(tiny_model) -> Path:
    """The tiny model's mixture-of-experts variant (Qwen3-MoE, 8 experts, 2 a token), beside it."""
    return tiny.make_tiny_model(tiny_model.parent / f"{tiny_model.name}-moe8", experts=8)
