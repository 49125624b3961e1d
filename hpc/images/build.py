"""Turn task images into what sandboxes run: a rootfs directory (bubblewrap) or a SIF (Apptainer).

Sources: an OCI image layout directory, an oci-archive or docker-archive tar (`docker save`),
or a registry reference such as `python:3.11`. A reference is pulled with skopeo into an OCI
layout first, so that every entry is keyed by content; where skopeo is missing this says so
and prints the commands to run on a machine that has the tools. A SIF is made by
`apptainer build`, which runs only where apptainer is installed.

    python -m hpc.images.build SRC... --cache DIR [--format rootfs|sif]

prints the path of each built image. `agentrl images build --slurm` builds many as a Slurm
job array (hpc/images/array.py).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .cache import FORMATS, CacheError, Entry, Format, ImageCache, Verify
from .extract import extract_image, extract_layer
from .oci import Image, ImageError, open_image, runtime_config

_COMPONENT = r"[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
_REF = re.compile(rf"^{_COMPONENT}(?::\d+)?(?:/{_COMPONENT})*(?::\w[\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$")
INSTALL = {
    "apptainer": "install Apptainer (https://apptainer.org/docs/admin/main/installation.html), "
                 "or `module load apptainer` on a cluster that provides it",
    "skopeo": "install skopeo (apt-get install skopeo / dnf install skopeo), "
              "or pull on a machine that has it and pass the OCI layout directory",
    "ch-image": "install charliecloud (apt-get install charliecloud python3-lark python3-requests / dnf install "
                "charliecloud), or `module load charliecloud` where the site provides it",
    "buildah": "install buildah (apt-get install buildah / dnf install buildah; Debian 12 and RHEL 8 package it), "
               "or `module load buildah` where the site provides it",
}


def is_reference(source: str) -> bool:
    """A registry reference rather than a path: it does not exist here and looks like name[:tag][@digest]."""
    if os.path.lexists(source) or source.endswith((".tar", ".tar.gz", ".tgz")):
        return False
    return source.startswith("docker://") or bool(_REF.match(source))


def docker_uri(ref: str) -> str:
    return ref if ref.startswith("docker://") else f"docker://{ref}"


def apptainer_uri(source: str, kind: str, ref: str | None = None) -> str:
    """The source as `apptainer build` names it (Apptainer user docs, "Docker and OCI")."""
    path = os.path.abspath(source)
    if kind == "docker-archive":
        return f"docker-archive:{path}"
    if kind == "oci-archive":
        return f"oci-archive:{path}"
    if kind == "oci-layout":
        return f"oci:{path}" + (f":{ref}" if ref else "")
    if kind == "docker-ref":
        return docker_uri(source)
    raise ValueError(f"unknown source kind {kind!r}")


def apptainer_build_command(out: Path | str, uri: str, fakeroot: bool = False) -> list[str]:
    """`apptainer build [--fakeroot] OUT.sif URI`. Converting an image needs no root; --fakeroot is
    for sites whose apptainer is set up to build only in a user namespace."""
    return ["apptainer", "build", *(["--fakeroot"] if fakeroot else []), str(out), uri]


def skopeo_copy_command(ref: str, layout: Path | str, registries_conf: Path | str | None = None) -> list[str]:
    """`skopeo copy docker://REF oci:DIR`: a registry image into an OCI layout directory. A site's
    mirrors come in a registries.conf, which skopeo reads only from --registries-conf (skopeo 1.9
    ignores CONTAINERS_REGISTRIES_CONF)."""
    conf = ["--registries-conf", str(registries_conf)] if registries_conf else []
    return ["skopeo", *conf, "copy", docker_uri(ref), f"oci:{layout}"]


def require_tool(tool: str, purpose: str, commands: Sequence[str] = ()) -> str:
    path = shutil.which(tool)
    if path is None:
        hint = "".join(f"\n  {c}" for c in commands)
        raise ImageError(f"{purpose} needs {tool}, which is not on PATH here: {INSTALL[tool]}"
                         + (f". On a machine that has it:{hint}" if hint else ""))
    return path


def run_tool(cmd: list[str], what: str) -> None:
    """Run a tool's command; a failure raises ImageError with `what` failed and the end of its output."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        tail = "\n".join(r.stdout.strip().splitlines()[-20:])
        raise ImageError(f"{what} failed (exit {r.returncode}): {shlex.join(cmd)}\n{tail}")


def build_image(source: str | Path, cache: ImageCache, fmt: Format = "rootfs", ref: str | None = None,
                fakeroot: bool = False, label: str | None = None, registries_conf: Path | str | None = None,
                verify: Verify | None = None) -> tuple[Entry, bool]:
    """The cache entry for `source` in `fmt`, built if absent; True if this call built it.

    `label` is what the entry records as its source, by which tasks find it (default: `source`,
    a path made absolute). A reference is pulled through `registries_conf`'s mirrors, if given.
    `verify` may refuse the image before it is published (ImageCache.build_or_get)."""
    source = str(source)
    if is_reference(source):
        return _build_reference(source, cache, fmt, fakeroot, registries_conf, verify)
    label = label or os.path.abspath(source)
    with open_image(source, ref) as image:
        build: Callable[[Path], object]
        if fmt == "rootfs":
            def build(payload: Path) -> None:
                extract_image(image, payload)
        elif fmt == "layers":
            build = _layered(image, cache, label)
        else:
            uri = apptainer_uri(source, image.kind, ref)

            def build(payload: Path) -> None:
                require_tool("apptainer", "building a SIF", [shlex.join(apptainer_build_command("OUT.sif", uri))])
                run_tool(apptainer_build_command(payload, uri, fakeroot), f"building {payload.name} from {source}")
        return cache.build_or_get(image.image_id, fmt, label, build, image.manifest_digest,
                                  runtime_config(image.config, f"{source}: config {image.image_id}"), verify)


def _layered(image: Image, cache: ImageCache, label: str) -> Callable[[Path], None]:
    """The build of a "layers" entry: each layer of `image` a "layer" entry of its own (kept once,
    whichever images share it), and the entry the list of their diff ids, lowest first."""
    missing = [layer.name for layer in image.layers if not layer.diff_id]
    if missing:
        raise ImageError(f"{image.source}: layers without a diff_id in the image config ({missing[0]}...): "
                         "build it as --format rootfs")

    diff_ids = [layer.diff_id for layer in image.layers if layer.diff_id]     # every layer's, as checked

    def build(payload: Path) -> None:
        for layer, diff_id in zip(image.layers, diff_ids, strict=True):
            cache.build_or_get(diff_id, "layer", label, functools.partial(extract_layer, layer))
        payload.write_text("".join(f"{diff_id}\n" for diff_id in diff_ids))
    return build


def _build_reference(ref: str, cache: ImageCache, fmt: Format, fakeroot: bool, registries_conf: Path | str | None,
                     verify: Verify | None) -> tuple[Entry, bool]:
    # A tag moves; the cache is keyed by content, so the image is copied here first and read.
    pulls = cache.root / ".pulls"
    layout = pulls / f"{os.getpid()}-{os.urandom(4).hex()}"
    cmds = [shlex.join(skopeo_copy_command(ref, "IMAGE-DIR")) + " && agentrl images build IMAGE-DIR --cache CACHE"]
    if fmt == "sif":
        cmds.append(shlex.join(apptainer_build_command("OUT.sif", docker_uri(ref))))
    require_tool("skopeo", f"pulling {ref}", cmds)
    pulls.mkdir(parents=True, exist_ok=True)
    try:
        run_tool(skopeo_copy_command(ref, layout, registries_conf), f"pulling {ref}")
        entry, built = build_image(layout, cache, fmt, fakeroot=fakeroot, label=ref, verify=verify)
    finally:
        shutil.rmtree(layout, ignore_errors=True)
    return entry, built


def run_builds(jobs: Sequence[tuple[str, Callable[[], tuple[Entry, bool]]]],
               out=sys.stderr) -> dict[str, Entry | Exception]:
    """Run each (name, build) in turn, going on past failures; progress as a bar (tqdm) or plain lines,
    then how many were built, cached and failed, and why each failure failed."""
    bar: tqdm[Any] | None = None
    try:
        from tqdm import tqdm
    except ImportError:
        pass
    else:
        if len(jobs) > 1:
            bar = tqdm(total=len(jobs), unit="image", file=out)
    results: dict[str, Entry | Exception] = {}
    counts = {"built": 0, "cached": 0, "failed": 0}
    for i, (name, build) in enumerate(jobs, 1):
        try:
            entry, built = build()
            outcome = "built" if built else "cached"
            results[name], line = entry, f"{outcome} {entry.payload}"
        except (ImageError, CacheError, OSError) as e:
            results[name], outcome, line = e, "failed", f"FAILED: {e}"
        counts[outcome] += 1
        if bar is not None:
            bar.write(f"{name}: {line}", file=out)
            bar.update()
            bar.set_postfix(counts, refresh=False)
        else:
            print(f"[{i}/{len(jobs)}] {name}: {line}", file=out, flush=True)
    if bar is not None:
        bar.close()
    failed = [(name, r) for name, r in results.items() if isinstance(r, Exception)]
    print(f"{counts['built']} built, {counts['cached']} cached, {counts['failed']} failed"
          + "".join(f"\n  FAILED {name}: {e}" for name, e in failed), file=out, flush=True)
    return results


def build_many(sources: Sequence[str], cache: ImageCache, fmt: Format = "rootfs", fakeroot: bool = False,
               registries_conf: Path | str | None = None, out=sys.stderr) -> dict[str, Entry | Exception]:
    """Build each source in turn, going on past failures (run_builds)."""
    return run_builds([(src, functools.partial(build_image, src, cache, fmt, fakeroot=fakeroot,
                                               registries_conf=registries_conf)) for src in sources], out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", metavar="SRC",
                   help="an OCI layout directory, an oci-archive or docker-archive tar, or a reference (python:3.11); "
                        "with `agentrl images build`, also tasks (a task directory, a data set, a prompts JSONL) "
                        "whose Dockerfiles it builds")
    p.add_argument("--cache", required=True, help="the image cache directory (on the shared filesystem)")
    p.add_argument("--format", choices=FORMATS, default="rootfs",
                   help="rootfs: a directory for bubblewrap (default); layers: for bubblewrap too, each layer "
                        "stored once, whichever images share it (needs root); sif: an Apptainer image "
                        "(needs apptainer)")
    p.add_argument("--fakeroot", action="store_true", help="pass --fakeroot to apptainer build")
    p.add_argument("--registries-conf", type=Path, metavar="FILE",
                   help="a registries.conf (containers-registries.conf(5)) naming the site's registry mirrors")


def run(args: argparse.Namespace) -> int:
    if args.registries_conf is not None and not args.registries_conf.is_file():
        raise SystemExit(f"--registries-conf {args.registries_conf}: no such file (a registries.conf, "
                         "containers-registries.conf(5))")
    results = build_many(args.sources, ImageCache(args.cache), args.format, args.fakeroot, args.registries_conf)
    for result in results.values():
        if isinstance(result, Entry):
            print(result.payload)
    return 0 if all(isinstance(r, Entry) for r in results.values()) else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpc.images.build", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
