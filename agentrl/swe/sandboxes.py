"""A task's sandbox: its image resolved to what the runtime runs, its work tree, its scratch disk.

A task names its image as the data set does: `host` (the host's own /usr, read-only, for
tasks that need only the host's programs), a path (a rootfs directory for bwrap, a SIF or
sandbox directory for Apptainer), or anything `agentrl images build` was given (a registry
reference, an OCI layout, an archive, a task's Dockerfile as `dockerfile:<key>`), found in the
image cache by that name; such an image's ENV (its OCI config) is the sandbox's too.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path

from hpc.images.cache import CacheError, Entry, Format, ImageCache, Verify
from hpc.images.dockerfile import BUILT_PREFIX
from hpc.images.oci import ImageError
from hpc.sandbox.base import Sandbox, SandboxError, SandboxSpec
from hpc.sandbox.factory import Runtime, make_sandbox
from hpc.sandbox.policy import Limits

from .episode import GRADER_DIRS
from .task import HOST_IMAGE, Resources, TaskSpec

_FORMAT: dict[str, Format] = {"bwrap": "rootfs", "apptainer": "sif"}


def resolve_image(image: str, runtime: Runtime, cache: ImageCache | None) -> str | None:
    """What `runtime` runs for a task's `image`: a path, or None for the host's own /usr.

    Raises SandboxError (an infrastructure failure, not the agent's) naming the command that
    builds a missing image.
    """
    return _resolve(image, runtime, cache)[0]


def _resolve(image: str, runtime: Runtime, cache: ImageCache | None
             ) -> tuple[str | None, dict[str, str], tuple[str, ...]]:
    """(what the runtime runs, the image's ENV, its layer directories top first if it is stored as layers):
    an image from the cache brings its config's ENV."""
    if image == HOST_IMAGE or runtime == "local":
        return None, {}, ()
    if runtime == "bwrap" and os.path.isdir(os.path.join(image, "usr")):
        return image, {}, ()              # an extracted rootfs
    if runtime == "apptainer" and (image.endswith(".sif") or os.path.isdir(os.path.join(image, "usr"))) \
            and os.path.exists(image):
        return image, {}, ()              # a SIF or a sandbox directory
    # a registry reference, an OCI layout, an archive or a task's Dockerfile: built into the cache
    name = os.path.abspath(image) if os.path.exists(image) else image
    layered = cache.find(name, "layers") if cache is not None and runtime == "bwrap" else None
    if layered is not None and cache is not None:
        try:
            dirs = tuple(map(str, cache.layer_dirs(layered)))
        except CacheError as e:
            raise SandboxError(str(e)) from None
        return str(layered.payload), dict(layered.record.env), dirs
    entry = _cached(name, runtime, cache)
    return str(entry.payload), dict(entry.record.env), ()


def _cached(image: str, runtime: Runtime, cache: ImageCache | None) -> Entry:
    fmt = _FORMAT[runtime]
    what = "PROMPTS.jsonl (or the task directories)" if image.startswith(BUILT_PREFIX) else image
    build = f"agentrl images build {what} --cache {cache.root if cache else 'DIR'} --format {fmt}"
    if cache is None:
        raise SandboxError(f"image {image!r} needs the image cache: pass --image-cache DIR "
                           f"(pool.image_cache in a run config, eval.pool.image_cache for eval), after `{build}`")
    entry = cache.find(image, fmt)
    if entry is None:
        raise SandboxError(f"image {image!r} is not in the cache {cache.root} as {fmt}: run `{build}`")
    return entry


def sandbox_limits(r: Resources) -> Limits:
    """The task's resources as the sandbox's limits."""
    return Limits(cpus=r.cpus, memory_mb=r.mem_mb, storage_mb=r.storage_mb, pids=r.pids)


def task_sandbox(spec: TaskSpec, *, runtime: Runtime = "bwrap", cache: ImageCache | None = None,
                 workdir_source: Path | str | None = None, scratch_dir: str | None = None,
                 env: Mapping[str, str] | None = None, adapter_socket: str | None = None,
                 ro_binds: Mapping[str, str] | None = None, allow_unsafe_local: bool = False,
                 fakeroot: bool = False, storage: str = "auto") -> Sandbox:
    """The (unstarted) sandbox for one attempt at `spec`."""
    image, image_env, layers = _resolve(spec.image, runtime, cache)
    sb_spec = SandboxSpec(workdir=spec.workdir, workdir_source=str(workdir_source) if workdir_source else None,
                          rootfs=image if runtime == "bwrap" and not layers else None, rootfs_layers=layers,
                          image_env=image_env, env=dict(env or {}),
                          ro_binds=dict(ro_binds or {}), adapter_socket=adapter_socket, scratch_dir=scratch_dir,
                          storage=storage,
                          limits=sandbox_limits(spec.resources), root_dirs=GRADER_DIRS)
    return make_sandbox(runtime, sb_spec, image=image if runtime == "apptainer" else None,
                        allow_unsafe_local=allow_unsafe_local, fakeroot=fakeroot)


CHECK_TIMEOUT_S = 300.0


def image_check(command: str, fmt: str, cache: ImageCache) -> Verify:
    """The post-build check of an image (task.toml [environment] build_check): `command` run with sh as
    the sandbox's root, in the image just built, before the cache publishes it. A RUN step can fail
    and still exit 0 (`curl ... | sh`); this is where a task says what its image must hold."""
    def verify(payload: Path, runtime: Mapping) -> None:
        workdir = runtime.get("workdir") or "/tmp"
        spec = SandboxSpec(workdir=workdir, image_env=dict(runtime.get("env") or {}),
                           rootfs=str(payload) if fmt == "rootfs" else None,
                           rootfs_layers=tuple(map(str, cache.layer_dirs(payload))) if fmt == "layers" else ())
        sb = make_sandbox("apptainer" if fmt == "sif" else "bwrap", spec, image=str(payload) if fmt == "sif" else None)

        async def run():
            async with sb:
                return await sb.exec(["/bin/sh", "-c", command], user="root", cwd=workdir,
                                     timeout_s=CHECK_TIMEOUT_S)

        try:
            r = asyncio.run(run())
        except SandboxError as e:
            raise ImageError(f"the image's check `{command}` could not run: {e}") from None
        if r.exit_code != 0 or r.timed_out:
            said = (r.stdout + r.stderr).decode(errors="replace").strip()[-500:] or "no output"
            how = "timed out" if r.timed_out else f"failed (exit {r.exit_code})"
            raise ImageError(f"the image's check `{command}` (task.toml [environment] build_check) {how}: "
                             f"{said}; the image is not cached")
    return verify
