"""One entry point from config to sandbox: the runtime (a run config's `pool.runtime`) picks bwrap, apptainer
or local."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Literal, get_args

from .base import Sandbox, SandboxSpec

Runtime = Literal["bwrap", "apptainer", "local"]
RUNTIMES: tuple[str, ...] = get_args(Runtime)


def make_sandbox(runtime: Runtime, spec: SandboxSpec, *, image: str | None = None,
                 allow_unsafe_local: bool = False, fakeroot: bool = False) -> Sandbox:
    """A sandbox of `runtime` (not started).

    `image`: apptainer: a SIF file or sandbox directory (default: spec.rootfs); bwrap: a rootfs
    directory, the same as spec.rootfs; local: not used. `fakeroot`: apptainer only (bwrap always
    has a root of its own user namespace; local runs everything as the current user).
    """
    if runtime == "bwrap":
        from .bwrap import BwrapSandbox
        if image is not None:
            if not os.path.isdir(image):
                raise ValueError(f"the bwrap runtime takes an extracted rootfs directory, not {image!r} "
                                 "(a SIF file is for the apptainer runtime)")
            spec = replace(spec, rootfs=image)
        return BwrapSandbox(spec)
    if runtime == "apptainer":
        from .apptainer import ApptainerSandbox
        image = image or spec.rootfs
        if not image:
            raise ValueError("the apptainer runtime needs an image: a SIF file or a sandbox directory "
                             "(the task's image, built by `agentrl images build`)")
        return ApptainerSandbox(spec, image, fakeroot=fakeroot)
    if runtime == "local":
        from .local import LocalSandbox
        return LocalSandbox(spec, allow_unsafe=allow_unsafe_local)
    raise ValueError(f"unknown sandbox runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
