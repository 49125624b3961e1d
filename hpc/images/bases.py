"""A data set's base images on the shared filesystem, so that nodes without network can build on them.

    agentrl images build TASKS --cache CACHE --pull-bases     on a node with network (a login node)
    CACHE/bases/<name>-<hash>/                               one OCI layout per FROM, as the Dockerfile names it

Every builder then starts from the layout when there is one, never from the registry: buildah
pulls it into its storage and tags it with the name the Dockerfile resolves to, Apptainer
bootstraps from it (`Bootstrap: oci`), charliecloud imports its rootfs. A layout is copied
beside its place and renamed in whole, so a half-pulled base is never used.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from .build import require_tool, run_tool, skopeo_copy_command
from .cache import ImageCache


def base_layout(cache: ImageCache, ref: str) -> Path:
    """Where the base `ref` (as a Dockerfile's FROM writes it) is kept: its name with every character but
    [A-Za-z0-9._-] as '_' (what transports such as `oci:PATH` accept), and a hash of it, so two never meet."""
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", ref)[:100]
    return cache.root / "bases" / f"{readable}-{hashlib.sha256(ref.encode()).hexdigest()[:12]}"


def pulled_base(cache: ImageCache, ref: str) -> Path | None:
    layout = base_layout(cache, ref)
    return layout if (layout / "index.json").is_file() else None


def pull_base(ref: str, cache: ImageCache, registries_conf: Path | None = None) -> tuple[Path, bool]:
    """The OCI layout of `ref`, copied from its registry (through the registries.conf) if absent; True if
    this call copied it."""
    found = pulled_base(cache, ref)
    if found is not None:
        return found, False
    layout = base_layout(cache, ref)
    require_tool("skopeo", f"pulling {ref}", [" ".join(skopeo_copy_command(ref, "DIR"))])
    tmp = layout.parent / f".tmp-{layout.name}-{os.getpid()}-{os.urandom(4).hex()}"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        run_tool(skopeo_copy_command(ref, tmp, registries_conf), f"pulling {ref}")
        try:
            os.rename(tmp, layout)
        except OSError:
            if pulled_base(cache, ref) is None:      # not another puller's complete copy: a real failure
                raise
        return layout, True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
