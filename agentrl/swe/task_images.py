"""`agentrl images build`: task images into the image cache, a data set's Dockerfiles among them.

A source is an image (an OCI layout, an oci-/docker-archive, a registry reference: see
hpc/images/build.py) or tasks: a Harbor task directory, a directory of them, or a prompts
JSONL. A task whose environment/Dockerfile needs a build carries its build context
(metadata.harbor.environment_build, written by `agentrl convert harbor`); each distinct
context, by its key, is built once, by buildah, Apptainer or charliecloud (--builder:
hpc/images/buildah.py, apptainer_build.py, charliecloud.py), checked (its task's build_check)
before the cache takes it, and its tasks find the image in the cache by the name
`dockerfile:<key>`. --slurm builds them as one job array (hpc/images/array.py), --pull-bases
copies their FROM images to the shared filesystem for nodes without network (bases.py).

The records are untrusted, like every task input: the context's paths are checked as they
are written, and the key is computed again from the files, so a record cannot put an image
into the cache under another build's name.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hpc.images.apptainer_build import build_environment_apptainer
from hpc.images.array import JobOutcome, array_script, job_alive, submit, watch, write_outcome
from hpc.images.bases import pull_base
from hpc.images.build import add_arguments as add_image_arguments
from hpc.images.build import build_image, is_reference, run_builds
from hpc.images.buildah import BuildahOptions, build_environment
from hpc.images.cache import CacheError, Entry, Format, ImageCache
from hpc.images.charliecloud import build_environment_charliecloud
from hpc.images.dockerfile import DOCKERFILE, build_key, built_image_name, plan_dockerfile
from hpc.images.oci import ImageError

from . import history
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


def build_jobs(args: argparse.Namespace, cache: ImageCache) -> list[Job]:
    """Every build the sources ask for, in an order that is the same wherever it is computed: the images
    as given, then the tasks' distinct environments in the order of their first task."""
    try:
        opts = BuildahOptions(registries_conf=args.registries_conf, storage_root=args.storage_root,
                              storage_driver=args.storage_driver)
    except ValidationError as e:
        raise SystemExit(f"agentrl images build: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    images = [s for s in args.sources if not is_task_source(s)]
    try:
        records = load_task_records([s for s in args.sources if is_task_source(s)])
        builds = environment_builds(records)
    except (TaskSpecError, ValueError, OSError) as e:
        raise SystemExit(f"agentrl images build: {e}") from None
    served = {str(m.get("instance_id")): (str(m.get("workdir") or "/testbed"), m.get("history", DEFAULT_HISTORY))
              for m in (r.get("metadata") or {} for r in records)}
    jobs = [Job(src, src if is_reference(src) else os.path.abspath(src),
                functools.partial(build_image, src, cache, args.format, fakeroot=args.fakeroot,
                                  registries_conf=args.registries_conf)) for src in images]
    for b in builds.values():
        more = f", {len(b.tasks) - 1} more" if len(b.tasks) > 1 else ""
        jobs.append(Job(f"dockerfile:{b.key[7:19]} (task {b.tasks[0]}{more})", built_image_name(b.key),
                        functools.partial(build_one, b, cache, args.format, opts, args.builder, args.fakeroot),
                        tuple((t, *served[t]) for t in b.tasks if t in served)))
    if not jobs:
        raise SystemExit("agentrl images build: the tasks given need no build (their images are prebuilt): "
                         "build those images by name, or give the tasks whose Dockerfile needs a build")
    return jobs


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_image_arguments(p)
    p.add_argument("--builder", choices=("buildah", "apptainer", "charliecloud"), default="buildah",
                   help="what builds tasks' Dockerfiles: buildah (default; any Dockerfile), apptainer build "
                        "(--fakeroot where the site requires it; no multi-stage builds), or charliecloud's "
                        "ch-image (unprivileged; rootfs only, flattened, USER ignored)")
    p.add_argument("--storage-root", type=Path, metavar="DIR",
                   help="where the builder keeps images and base layers (buildah --root, ch-image -s; default: "
                        "buildah's own, CACHE/.charliecloud)")
    p.add_argument("--storage-driver", choices=("vfs", "overlay"),
                   help="buildah's storage driver (vfs works on any filesystem, NFS too)")
    p.add_argument("--slurm", action="store_true",
                   help="build as a Slurm job array (what is cached already is not submitted), and watch it")
    p.add_argument("--parallelism", type=int, default=8, help="with --slurm: array tasks at once (default 8)")
    p.add_argument("--sbatch-option", action="append", default=[], metavar="OPT",
                   help="with --slurm: an sbatch option for the array, such as --partition=cpu (repeatable)")
    p.add_argument("--no-wait", action="store_true", help="with --slurm: submit, print the job id, and return")
    p.add_argument("--pull-bases", action="store_true",
                   help="only pull the tasks' base images (their FROM lines) into CACHE/bases, on a node with "
                        "network, for builds on nodes without it")
    p.add_argument("--job-index", type=int, help=argparse.SUPPRESS)      # an array task: build this one
    p.add_argument("--outcomes", type=Path, help=argparse.SUPPRESS)      # ... and say how it went here


def _array_task(args: argparse.Namespace, jobs: list[Job]) -> int:
    if args.outcomes is None or not 0 <= args.job_index < len(jobs):
        raise SystemExit(f"agentrl images build: --job-index {args.job_index} needs --outcomes and must be one of "
                         f"the {len(jobs)} builds")
    job = jobs[args.job_index]
    print(f"building {job.name}", file=sys.stderr, flush=True)
    try:
        entry, built = job.build()
        outcome = JobOutcome(index=args.job_index, name=job.name, outcome="built" if built else "cached",
                             message=str(entry.payload))
    except (ImageError, CacheError, OSError) as e:
        outcome = JobOutcome(index=args.job_index, name=job.name, outcome="failed", message=str(e))
    print(f"{outcome.outcome}: {outcome.message}", file=sys.stderr, flush=True)
    write_outcome(args.outcomes, outcome)
    return 0 if outcome.outcome != "failed" else 1


def _submit(args: argparse.Namespace, jobs: list[Job], cache: ImageCache) -> int:
    if args.parallelism < 1:
        raise SystemExit(f"agentrl images build: --parallelism must be at least 1, got {args.parallelism}")
    pending = [i for i, job in enumerate(jobs) if cache.find(job.label, args.format) is None]
    print(f"{len(jobs) - len(pending)} of {len(jobs)} builds are cached already", file=sys.stderr)
    if not pending:
        return 0
    run_dir = cache.root / "builds" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir.mkdir(parents=True)
    command = ["-m", "agentrl.cli", "images", "build", *(s if is_reference(s) else os.path.abspath(s)
                                                         for s in args.sources),
               "--cache", str(cache.root.resolve()), "--format", args.format]
    for flag, value in (("--registries-conf", args.registries_conf), ("--storage-root", args.storage_root)):
        if value is not None:
            command += [flag, str(Path(value).resolve())]
    command += [*(["--storage-driver", args.storage_driver] if args.storage_driver else []),
                *(["--fakeroot"] if args.fakeroot else []), "--builder", args.builder]
    script = run_dir / "job.sbatch"
    script.write_text(array_script(command, pending, args.parallelism, run_dir, sbatch_options=args.sbatch_option))
    job_id = submit(script)
    print(f"submitted {len(pending)} builds as job {job_id}; outcomes and output in {run_dir}", file=sys.stderr)
    if args.no_wait:
        print(job_id)
        return 0
    done = watch(run_dir, pending, {i: jobs[i].name for i in pending}, lambda: job_alive(job_id))
    failed = [o for o in done.values() if o.outcome == "failed"]
    for o in failed:
        print(f"  FAILED {o.name}: {o.message}", file=sys.stderr)
    return 1 if failed else 0


def _pull_bases(args: argparse.Namespace, cache: ImageCache) -> int:
    try:
        builds = environment_builds(load_task_records([s for s in args.sources if is_task_source(s)]))
        bases = list(dict.fromkeys(base for b in builds.values()
                                   for base in plan_dockerfile(b.files[DOCKERFILE].decode(), b.files).bases))
    except (TaskSpecError, ValueError, OSError) as e:
        raise SystemExit(f"agentrl images build: {e}") from None
    failed = 0
    for i, base in enumerate(bases, 1):
        try:
            layout, pulled = pull_base(base, cache, args.registries_conf)
            print(f"[{i}/{len(bases)}] {base}: {'pulled' if pulled else 'present'} {layout}", file=sys.stderr)
        except (ImageError, OSError) as e:
            failed += 1
            print(f"[{i}/{len(bases)}] {base}: FAILED: {e}", file=sys.stderr)
    print(f"{len(bases) - failed} of {len(bases)} bases in {cache.root / 'bases'}", file=sys.stderr)
    return 1 if failed else 0


def _trees(entry: Entry, cache: ImageCache) -> list[Path]:
    """A built image as file trees to read, top first (none for a SIF)."""
    if entry.record.format == "layers":
        try:
            return cache.layer_dirs(entry)
        except CacheError:
            return []
    return [entry.payload] if entry.payload.is_dir() else []


def run(args: argparse.Namespace) -> int:
    cache = ImageCache(args.cache)
    if args.pull_bases:
        return _pull_bases(args, cache)
    jobs = build_jobs(args, cache)
    if args.job_index is not None:
        return _array_task(args, jobs)
    if args.slurm:
        return _submit(args, jobs, cache)
    results = run_builds([(job.name, job.build) for job in jobs], sys.stderr)
    for job in jobs:
        if isinstance(entry := results.get(job.name), Entry):
            for warning in history.image_warnings(_trees(entry, cache), list(job.tasks)):
                print(f"warning: {warning}", file=sys.stderr)
    for result in results.values():
        if isinstance(result, Entry):
            print(result.payload)
    return 0 if all(isinstance(r, Entry) for r in results.values()) else 1
