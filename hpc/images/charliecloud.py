"""A task's environment built with charliecloud's `ch-image build`, where neither buildah nor Apptainer is.

    ch-image -s STORAGE import BASE_ROOTFS NAME       each FROM, pulled and extracted by us first
    ch-image -s STORAGE build -t TAG -f CTX/Dockerfile CTX
    STORAGE/img/TAG                                    the image: a plain directory tree, copied to the cache

ch-image needs no privileges at all. It pulls only over HTTPS and reads no registries.conf,
so a FROM is pulled the way every other image is (skopeo through the site's registries.conf,
hpc/images/build.py) and imported into ch-image's storage under the Dockerfile's own name,
which the build then finds there: that also builds offline once the bases are in the cache.

Its limits, which the image keeps (charliecloud's own documentation): one flattened tree, no
layers; files owned by whoever built it (root inside); setuid bits lost; USER ignored. The
image's ENV and WORKDIR come from its metadata (ch/metadata.json).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path

from .bases import pulled_base
from .build import build_image, require_tool
from .buildah import NETWORK_FAILURE_FIX, failed_step, network_failures
from .cache import Entry, Format, ImageCache, Verify
from .dockerfile import DOCKERFILE, built_image_name, plan_context
from .oci import ImageError

_STEP = re.compile(r"^\s*(\d+)[.*]\s+(\S.*)$")      # "  4. RUN ..." / "  1* FROM ..." (cached)


def ch_image_command() -> list[str]:
    """ch-image, run by the Python it was installed for: a distribution's ch-image starts with
    `#!/usr/bin/env python3`, and a virtualenv's or pyenv's python3 earlier on PATH lacks its modules
    (lark), so /usr/bin's ch-image runs on /usr/bin/python3."""
    path = require_tool("ch-image", "building with charliecloud")
    if os.path.dirname(os.path.realpath(path)) == "/usr/bin" and os.path.exists("/usr/bin/python3"):
        return ["/usr/bin/python3", path]
    return [path]


def _env() -> dict[str, str]:
    # ch-image asks $USER for its storage's default name, and refuses to run without it
    return {**os.environ, "USER": os.environ.get("USER") or pwd.getpwuid(os.getuid()).pw_name}


def image_dir(storage: Path, name: str) -> Path:
    """Where ch-image keeps the image `name` (its own encoding: '/' as '%', ':' as '+')."""
    return storage / "img" / name.replace("/", "%").replace(":", "+")


def ch_image_step(line: str) -> str | None:
    """The step a line of a ch-image log announces (`  4. RUN ...`, `  1* FROM ...` when cached)."""
    m = _STEP.match(line)
    return f"step {m.group(1)} ({m.group(2)})" if m else None


def build_environment_charliecloud(context: Path, key: str, cache: ImageCache, fmt: Format = "rootfs", *,
                                   storage: Path, registries_conf: Path | None = None,
                                   what: str | None = None, verify: Verify | None = None) -> tuple[Entry, bool]:
    """The cache entry of the image built from `context` with ch-image; True if this call built it."""
    what = what or str(context / DOCKERFILE)
    if fmt != "rootfs":
        raise ImageError(f"building {what} with charliecloud makes a rootfs (one flattened tree), not {fmt!r}: "
                         "choose --format rootfs, or build with buildah or Apptainer")
    label = built_image_name(key)
    found = cache.find(label, fmt)
    if found is not None:
        return found, False
    ch = [*ch_image_command(), "-s", str(storage)]
    plan = plan_context(context)
    hexkey = key.partition(":")[2]
    log = cache.root / "logs" / f"{hexkey}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        for base in plan.bases:
            if not image_dir(storage, base).is_dir():
                layout = pulled_base(cache, base)     # pulled to the shared filesystem, or from the registry
                entry = cache.find(base, "rootfs") or build_image(layout or base, cache, "rootfs", label=base,
                                                                  registries_conf=registries_conf)[0]
                r = subprocess.run([*ch, "import", str(entry.payload), base], stdout=out, stderr=subprocess.STDOUT,
                                   env=_env(), stdin=subprocess.DEVNULL)
                if r.returncode != 0:
                    raise ImageError(f"importing {base} into charliecloud's storage {storage} failed: see {log}")
        tag = f"agentrl-build:{hexkey[:32]}"
        code = subprocess.run([*ch, "build", "-t", tag, "-f", str(context / DOCKERFILE), str(context)],
                              stdout=out, stderr=subprocess.STDOUT, env=_env(), stdin=subprocess.DEVNULL).returncode
    text = log.read_text(errors="replace")
    offline = network_failures(text, ch_image_step)
    if code != 0:
        hint = f"; it could not reach the network ({offline[-1][1]})" if offline else ""
        where = failed_step(text, ch_image_step) or "the start"
        raise ImageError(f"building {what} failed at {where} (exit {code}){hint}: see {log}")
    if offline:
        steps = "; ".join(f"{step}: {line}" for step, line in offline)
        raise ImageError(f"building {what}: {steps}. {NETWORK_FAILURE_FIX} Log: {log}")
    tree = image_dir(storage, tag)
    meta = json.loads((tree / "ch" / "metadata.json").read_text())
    try:
        return cache.build_or_get(key, fmt, label, lambda payload: shutil.copytree(tree, payload, symlinks=True),
                                  None, {"env": dict(meta.get("env") or {}), "workdir": meta.get("cwd") or None,
                                         "user": None}, verify)
    finally:
        subprocess.run([*ch, "delete", tag], capture_output=True, env=_env())
