"""A task's environment built from its Dockerfile with Apptainer, where the site has no buildah.

    apptainer build [--fakeroot] [--nohttps] [--sandbox] OUT CTX.def

from the definition hpc/images/apptainer_def.py writes (the Dockerfile's steps in order). The
base is pulled from where the site's registries.conf would send it (hpc/images/registries.py;
--nohttps for a plain-HTTP mirror). `--format sif` makes a SIF; `--format rootfs` a sandbox
directory, which bwrap runs as any rootfs. The log, its `STEP n/m` lines and the check for
downloads that could not reach the network are buildah's (hpc/images/buildah.py).
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
from pathlib import Path

from .apptainer_def import definition, runtime_env
from .bases import pulled_base
from .build import apptainer_build_command, require_tool
from .buildah import NETWORK_FAILURE_FIX, failed_step, network_failures
from .cache import Entry, Format, ImageCache, Verify
from .dockerfile import DOCKERFILE, built_image_name, plan_context
from .oci import ImageError
from .registries import mirror_reference


def build_environment_apptainer(context: Path, key: str, cache: ImageCache, fmt: Format = "sif", *,
                                fakeroot: bool = False, registries_conf: Path | None = None,
                                what: str | None = None, verify: Verify | None = None) -> tuple[Entry, bool]:
    """The cache entry of the image built from `context` with Apptainer; True if this call built it."""
    what = what or str(context / DOCKERFILE)
    if fmt not in ("sif", "rootfs"):
        raise ImageError(f"building {what} with Apptainer makes a SIF or a rootfs (sandbox directory), not "
                         f"{fmt!r}: choose --format sif or rootfs, or build with buildah")
    label = built_image_name(key)
    found = cache.find(label, fmt)
    if found is not None:
        return found, False
    if any(c.isspace() for c in str(context)):
        raise ImageError(f"{context}: a build context with whitespace in its path cannot be named in %files")
    plan = plan_context(context)
    layout = pulled_base(cache, plan.bases[0])
    if layout is not None:                      # pulled to the shared filesystem: no registry needed
        base, insecure, bootstrap = str(layout), False, "oci"
    else:
        base, insecure = mirror_reference(plan.bases[0],
                                          registries_conf.read_text() if registries_conf is not None else None)
        bootstrap = "docker"
    def_path = context.parent / "environment.def"
    def_path.write_text(definition(dataclasses.replace(plan, bases=(base,)), str(context), bootstrap=bootstrap))
    hexkey = key.partition(":")[2]
    log = cache.root / "logs" / f"{hexkey}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    require_tool("apptainer", f"building {what}", [shlex.join(apptainer_build_command("OUT.sif", str(def_path)))])
    user = next((s.value.split()[0] for s in reversed(plan.final_steps) if s.op == "USER"), None)

    def build(payload: Path) -> None:
        cmd = apptainer_build_command(payload, str(def_path), fakeroot)
        cmd[2:2] = [*(["--nohttps"] if insecure else []), *(["--sandbox"] if fmt == "rootfs" else [])]
        with log.open("w") as out:
            code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
        text = log.read_text(errors="replace")
        offline = network_failures(text)
        if code != 0:
            hint = f"; it could not reach the network ({offline[-1][1]})" if offline else ""
            raise ImageError(f"building {what} failed at {failed_step(text) or 'the base image'} (exit {code})"
                             f"{hint}: see {log}")
        if offline:
            steps = "; ".join(f"{step}: {line}" for step, line in offline)
            raise ImageError(f"building {what}: {steps}. {NETWORK_FAILURE_FIX} Log: {log}")

    return cache.build_or_get(key, fmt, label, build, None,
                              {"env": runtime_env(plan), "workdir": plan.workdir, "user": user}, verify)
