"""Task images: each distinct build context of the tasks' Dockerfiles (metadata.harbor.environment_build, from
`agentrl convert harbor`) built once, by its key, into the image cache as `dockerfile:<key>`, after its
task's build_check passes; images given by name built as they are (`agentrl images build`: the command in
agentrl/commands/images_build.py). A record is untrusted: its paths are checked as they are written and its
key computed again from the files, so it cannot put an image into the cache under another build's name.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from hpc.images.apptainer_build import build_environment_apptainer
from hpc.images.build import build_image, is_reference
from hpc.images.buildah import BuildahOptions, build_environment
from hpc.images.cache import CacheError, Entry, Format, ImageCache
from hpc.images.charliecloud import build_environment_charliecloud
from hpc.images.dockerfile import DOCKERFILE, build_key, built_image_name, plan_dockerfile

from .harbor import expand_task_dirs
from .loaded import decode_payloads, load_task_records, materialize
from .sandboxes import image_check
from .task import DEFAULT_HISTORY, History, TaskSpecError


@dataclass(frozen=True)
class EnvironmentBuild:
    key: str
    files: dict[str, bytes]          # the build context, the Dockerfile among them
    executable: frozenset[str]
    tasks: tuple[str, ...]           # the instance ids that run in it
    check: str | None = None         # task.toml [environment] build_check: what the image must pass


def environment_builds(records: list[dict[str, Any]]) -> dict[str, EnvironmentBuild]:
    """The distinct environment builds of these task records, by key, each with the tasks that use it."""
    builds: dict[str, EnvironmentBuild] = {}
    for record in records:
        meta = record.get("metadata") or {}
        given = (meta.get("harbor") or {}).get("environment_build")
        if given is None:
            continue
        where = f"task {meta.get('instance_id')!r}: metadata.harbor.environment_build"
        if not isinstance(given, dict) or not isinstance(given.get("key"), str) \
                or not isinstance(given.get("executable", []), list):
            raise TaskSpecError(f"{where}: must be an object with key, files and executable: convert the task "
                                "again (`agentrl convert harbor`)")
        files = decode_payloads(given.get("files"), f"{where}.files")
        executable = frozenset(given.get("executable", []))
        check = given.get("check")
        if check is not None and not isinstance(check, str):
            raise TaskSpecError(f"{where}.check: must be a shell command, got {check!r}")
        key = build_key(files, executable, check=check)
        if key != given["key"] or meta.get("image") != built_image_name(key):
            raise TaskSpecError(f"{where}: the key {given['key']!r} (image {meta.get('image')!r}) is not the "
                                f"content's, {key!r}: convert the task again (`agentrl convert harbor`)")
        tasks = builds[key].tasks if key in builds else ()
        builds[key] = EnvironmentBuild(key, files, executable, (*tasks, str(meta.get("instance_id"))), check)
    return builds


def is_task_source(source: str) -> bool:
    """Tasks (a prompts JSONL, a task directory or a data set of them) rather than an image."""
    path = Path(source)
    if path.suffix == ".jsonl":
        return True
    if not path.is_dir() or (path / "oci-layout").exists():
        return False
    return any((d / "task.toml").exists() for d in expand_task_dirs([path]))


def build_one(build: EnvironmentBuild, cache: ImageCache, fmt: Format, opts: BuildahOptions, builder: str,
              fakeroot: bool) -> tuple[Entry, bool]:
    more = f" and {len(build.tasks) - 1} more" if len(build.tasks) > 1 else ""
    what = f"the environment of task {build.tasks[0]}{more} (environment/{DOCKERFILE})"
    verify = image_check(build.check, fmt, cache) if build.check else None
    with tempfile.TemporaryDirectory(prefix="agentrl-context-") as tmp:
        context = materialize(build.files, Path(tmp) / "context", build.executable, what="environment_build.files")
        if builder == "apptainer":
            return build_environment_apptainer(context, build.key, cache, fmt, fakeroot=fakeroot,
                                               registries_conf=opts.registries_conf, what=what, verify=verify)
        if builder == "charliecloud":
            return build_environment_charliecloud(context, build.key, cache, fmt, what=what, verify=verify,
                                                  storage=opts.storage_root or cache.root / ".charliecloud",
                                                  registries_conf=opts.registries_conf)
        return build_environment(context, build.key, cache, fmt, opts, fakeroot, what=what, verify=verify)


@dataclass(frozen=True)
class Job:
    name: str                                     # for people
    label: str                                    # what the cache finds the image by
    build: Callable[[], tuple[Entry, bool]]
    tasks: tuple[tuple[str, str, History], ...] = ()   # (instance id, workdir, history) of the tasks it serves


class TaskImagesError(ValueError):
    """The sources cannot be built as asked; the message says why."""


@dataclass(frozen=True)
class BuildRequest:
    """What `agentrl images build` was asked: the sources and how to build them."""
    sources: tuple[str, ...]
    format: Format = "rootfs"
    fakeroot: bool = False
    registries_conf: Path | None = None
    storage_root: Path | None = None
    storage_driver: Literal["vfs", "overlay"] | None = None
    builder: str = "buildah"


def task_bases(sources: list[str]) -> list[str]:
    """The base images (FROM lines) of the tasks' Dockerfiles among the sources, each once."""
    try:
        builds = environment_builds(load_task_records([s for s in sources if is_task_source(s)]))
        return list(dict.fromkeys(base for b in builds.values()
                                  for base in plan_dockerfile(b.files[DOCKERFILE].decode(), b.files).bases))
    except (TaskSpecError, ValueError, OSError) as e:
        raise TaskImagesError(str(e)) from None



def build_jobs(req: BuildRequest, cache: ImageCache) -> list[Job]:
    """Every build the sources ask for, in an order that is the same wherever it is computed: the images
    as given, then the tasks' distinct environments in the order of their first task."""
    try:
        opts = BuildahOptions(registries_conf=req.registries_conf, storage_root=req.storage_root,
                              storage_driver=req.storage_driver)
    except ValidationError as e:
        raise TaskImagesError(e.errors()[0]["msg"].removeprefix("Value error, ")) from None
    images = [s for s in req.sources if not is_task_source(s)]
    try:
        records = load_task_records([s for s in req.sources if is_task_source(s)])
        builds = environment_builds(records)
    except (TaskSpecError, ValueError, OSError) as e:
        raise TaskImagesError(str(e)) from None
    served = {str(m.get("instance_id")): (str(m.get("workdir") or "/testbed"), m.get("history", DEFAULT_HISTORY))
              for m in (r.get("metadata") or {} for r in records)}
    jobs = [Job(src, src if is_reference(src) else os.path.abspath(src),
                functools.partial(build_image, src, cache, req.format, fakeroot=req.fakeroot,
                                  registries_conf=req.registries_conf)) for src in images]
    for b in builds.values():
        more = f", {len(b.tasks) - 1} more" if len(b.tasks) > 1 else ""
        jobs.append(Job(f"dockerfile:{b.key[7:19]} (task {b.tasks[0]}{more})", built_image_name(b.key),
                        functools.partial(build_one, b, cache, req.format, opts, req.builder, req.fakeroot),
                        tuple((t, *served[t]) for t in b.tasks if t in served)))
    if not jobs:
        raise TaskImagesError("the tasks given need no build (their images are prebuilt): build those images by "
                              "name, or give the tasks whose Dockerfile needs a build")
    return jobs


def image_trees(entry: Entry, cache: ImageCache) -> list[Path]:
    """A built image as file trees to read, top first (none for a SIF)."""
    if entry.record.format == "layers":
        try:
            return cache.layer_dirs(entry)
        except CacheError:
            return []
    return [entry.payload] if entry.payload.is_dir() else []
