"""SGLang's own code, importable on a CPU machine: one directory per version, built from the package index.

`environment(version, root)` installs into ROOT/sglang-VERSION, with `pip install --target --no-deps`, the
SGLang wheel and the few packages importing its argument parser and request types needs that the project's
venv lacks or holds at a version SGLang's pins refuse (INSTALLS). Everything else comes from the venv (torch
2.13 CPU, pydantic, fastapi, numpy, ...): tests/sglang_oracle.py runs with this directory first on sys.path
and serves inert stubs for the GPU-only packages SGLang imports (its STUBBED). A directory is built once: its
stamp names what was installed, so a changed INSTALLS rebuilds it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from ci import skip_or_fail

PINNED = "0.5.12"     # containers/sglang.def
NEWEST = "0.5.23"     # the newest release on PyPI when this was written (`pip index versions sglang`)
VERSIONS = (PINNED, NEWEST)

# Per version: what is installed besides sglang itself, and why.
# - transformers at SGLang's own pin: SGLang registers configs (qwen3_asr, ...) that the venv's newer
#   transformers already has, and registering one twice is an error.
# - tokenizers and huggingface_hub where that transformers refuses the venv's at import (0.5.12's 5.6.0 wants
#   tokenizers <= 0.23.0 and huggingface_hub < 2).
# - msgspec and dill: SGLang's IPC structs subclass msgspec.Struct, and a logit processor is dill-pickled at
#   import; stubs cannot stand in for either.
INSTALLS = {
    "0.5.12": ["transformers==5.6.0", "tokenizers==0.22.2", "huggingface_hub==1.33.0", "msgspec==0.23.0",
               "dill==0.4.1"],
    "0.5.23": ["transformers==5.19.0", "msgspec==0.23.0", "dill==0.4.1"],
}
STAMP = ".agentrl-complete"


def requirements(version: str) -> list[str]:
    return [f"sglang=={version}", *INSTALLS[version]]


def environment(version: str, root: Path) -> Path:
    """ROOT/sglang-VERSION with SGLang and INSTALLS[version] in it, built unless a complete build is there."""
    target = root / f"sglang-{version}"
    wanted = "\n".join(requirements(version))
    stamp = target / STAMP
    if stamp.exists() and stamp.read_text() == wanted:
        return target
    shutil.rmtree(target, ignore_errors=True)
    # --no-compile: the oracle imports a few hundred of SGLang's thousands of modules; Python caches those.
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--no-compile", "--target", str(target), *requirements(version)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        raise OSError(f"pip could not install {' '.join(requirements(version))} into {target}: "
                      f"{(r.stderr.strip().splitlines() or ['?'])[-1]}")
    stamp.write_text(wanted)
    return target


def environment_or_skip(version: str, root: Path) -> Path:
    """The environment; where it cannot be built (no package index), a skip saying how, or under CI a failure."""
    try:
        return environment(version, root)
    except (OSError, subprocess.TimeoutExpired) as e:
        problem = (f"SGLang {version}'s contract tests need its wheel from the package index: {e} "
                   f"(with network, `pytest tests/test_sglang_contract.py` builds {root})")
        skip_or_fail("the SGLang contract tests", problem)
