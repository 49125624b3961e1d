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
import os
import sys
import time
from pathlib import Path

from hpc.images.array import JobOutcome, array_script, job_alive, submit, watch, write_outcome
from hpc.images.bases import pull_base
from hpc.images.build import add_arguments as add_image_arguments
from hpc.images.build import is_reference, run_builds
from hpc.images.cache import CacheError, Entry, ImageCache
from hpc.images.oci import ImageError

from ..swe import history
from ..swe.task_images import BuildRequest, Job, TaskImagesError, build_jobs, image_trees, task_bases


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


def _pull_bases(sources: list[str], cache: ImageCache, registries_conf: Path | None) -> int:
    try:
        bases = task_bases(sources)
    except TaskImagesError as e:
        print(f"agentrl images build: {e}", file=sys.stderr)
        return 1
    failed = 0
    for i, base in enumerate(bases, 1):
        try:
            layout, pulled = pull_base(base, cache, registries_conf)
            print(f"[{i}/{len(bases)}] {base}: {'pulled' if pulled else 'present'} {layout}", file=sys.stderr)
        except (ImageError, OSError) as e:
            failed += 1
            print(f"[{i}/{len(bases)}] {base}: FAILED: {e}", file=sys.stderr)
    print(f"{len(bases) - failed} of {len(bases)} bases in {cache.root / 'bases'}", file=sys.stderr)
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    cache = ImageCache(args.cache)
    if args.pull_bases:
        return _pull_bases(args.sources, cache, args.registries_conf)
    try:
        jobs = build_jobs(BuildRequest(tuple(args.sources), args.format, args.fakeroot, args.registries_conf,
                                       args.storage_root, args.storage_driver, args.builder), cache)
    except TaskImagesError as e:
        print(f"agentrl images build: {e}", file=sys.stderr)
        return 1
    if args.job_index is not None:
        return _array_task(args, jobs)
    if args.slurm:
        return _submit(args, jobs, cache)
    results = run_builds([(job.name, job.build) for job in jobs], sys.stderr)
    for job in jobs:
        if isinstance(entry := results.get(job.name), Entry):
            for warning in history.image_warnings(image_trees(entry, cache), list(job.tasks)):
                print(f"warning: {warning}", file=sys.stderr)
    for result in results.values():
        if isinstance(result, Entry):
            print(result.payload)
    return 0 if all(isinstance(r, Entry) for r in results.values()) else 1
