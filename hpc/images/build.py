"""Turn task images into what sandboxes run: a rootfs directory (bubblewrap) or a SIF (Apptainer).

Sources: an OCI image layout directory, an oci-archive or docker-archive tar (`docker save`),
or a registry reference such as `python:3.11`. A reference is pulled with skopeo into an OCI
layout first, so that every entry is keyed by content; where skopeo is missing this says so
and prints the commands to run on a machine that has the tools. A SIF is made by
`apptainer build`, which runs only where apptainer is installed.

    python -m hpc.images.build SRC... --cache DIR [--format rootfs|sif]

prints the path of each built image. `build_array_script` renders a Slurm job array that
builds many images, one per task.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .cache import FORMATS, CacheError, Entry, ImageCache
from .extract import extract_image
from .oci import ImageError, open_image

_COMPONENT = r"[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
_REF = re.compile(rf"^{_COMPONENT}(?::\d+)?(?:/{_COMPONENT})*(?::\w[\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$")
INSTALL = {
    "apptainer": "install Apptainer (https://apptainer.org/docs/admin/main/installation.html), "
                 "or `module load apptainer` on a cluster that provides it",
    "skopeo": "install skopeo (apt-get install skopeo / dnf install skopeo), "
              "or pull on a machine that has it and pass the OCI layout directory",
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


def skopeo_copy_command(ref: str, layout: Path | str) -> list[str]:
    """`skopeo copy docker://REF oci:DIR`: a registry image into an OCI layout directory."""
    return ["skopeo", "copy", docker_uri(ref), f"oci:{layout}"]


def require_tool(tool: str, purpose: str, commands: Sequence[str] = ()) -> str:
    path = shutil.which(tool)
    if path is None:
        hint = "".join(f"\n  {c}" for c in commands)
        raise ImageError(f"{purpose} needs {tool}, which is not on PATH here: {INSTALL[tool]}"
                         + (f". On a machine that has it:{hint}" if hint else ""))
    return path


def _run(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        tail = "\n".join(r.stdout.strip().splitlines()[-20:])
        raise ImageError(f"{what} failed (exit {r.returncode}): {shlex.join(cmd)}\n{tail}")


def build_image(source: str | Path, cache: ImageCache, fmt: str = "rootfs", ref: str | None = None,
                fakeroot: bool = False, label: str | None = None) -> tuple[Entry, bool]:
    """The cache entry for `source` in `fmt`, built if absent; True if this call built it.

    `label` is what the entry records as its source, by which tasks find it (default: `source`,
    a path made absolute)."""
    source = str(source)
    if is_reference(source):
        return _build_reference(source, cache, fmt, fakeroot)
    label = label or os.path.abspath(source)
    with open_image(source, ref) as image:
        if fmt == "rootfs":
            def build(payload: Path) -> None:
                extract_image(image, payload)
        else:
            uri = apptainer_uri(source, image.kind, ref)

            def build(payload: Path) -> None:
                require_tool("apptainer", "building a SIF", [shlex.join(apptainer_build_command("OUT.sif", uri))])
                _run(apptainer_build_command(payload, uri, fakeroot), f"building {payload.name} from {source}")
        return cache.build_or_get(image.image_id, fmt, label, build, image.manifest_digest)


def _build_reference(ref: str, cache: ImageCache, fmt: str, fakeroot: bool) -> tuple[Entry, bool]:
    # A tag moves; the cache is keyed by content, so the image is copied here first and read.
    pulls = cache.root / ".pulls"
    layout = pulls / f"{os.getpid()}-{os.urandom(4).hex()}"
    cmds = [shlex.join(skopeo_copy_command(ref, "IMAGE-DIR")) + " && agentrl images build IMAGE-DIR --cache CACHE"]
    if fmt == "sif":
        cmds.append(shlex.join(apptainer_build_command("OUT.sif", docker_uri(ref))))
    require_tool("skopeo", f"pulling {ref}", cmds)
    pulls.mkdir(parents=True, exist_ok=True)
    try:
        _run(skopeo_copy_command(ref, layout), f"pulling {ref}")
        entry, built = build_image(layout, cache, fmt, fakeroot=fakeroot, label=ref)
    finally:
        shutil.rmtree(layout, ignore_errors=True)
    return entry, built


def build_many(sources: Sequence[str], cache: ImageCache, fmt: str = "rootfs", fakeroot: bool = False,
               out=sys.stderr) -> dict[str, Entry | Exception]:
    """Build each source in turn, going on past failures; progress as a bar (tqdm) or plain lines."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    results: dict[str, Entry | Exception] = {}
    bar = tqdm(total=len(sources), unit="image", file=out) if tqdm and len(sources) > 1 else None
    for i, src in enumerate(sources, 1):
        try:
            entry, built = build_image(src, cache, fmt, fakeroot=fakeroot)
            results[src], line = entry, f"{'built' if built else 'cached'} {entry.payload}"
        except (ImageError, CacheError, OSError) as e:
            results[src], line = e, f"FAILED: {e}"
        if bar is not None:
            bar.write(f"{src}: {line}", file=out)
            bar.update()
        else:
            print(f"[{i}/{len(sources)}] {src}: {line}", file=out, flush=True)
    if bar is not None:
        bar.close()
    return results


def build_array_script(sources: Sequence[str], cache: Path | str, parallelism: int, fmt: str = "rootfs",
                       job_name: str = "agentrl-images", sbatch_options: Sequence[str] = ()) -> str:
    """An sbatch script whose array task i builds sources[i]; at most `parallelism` run at once.

    Tasks that build one image race safely (the cache keeps one entry). The Python comes from
    AGENTRL_PYTHON (default python3), as in the launch scripts.
    """
    if not sources:
        raise ValueError("no sources to build")
    if parallelism < 1:
        raise ValueError("parallelism must be at least 1")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name}",
             f"#SBATCH --array=0-{len(sources) - 1}%{parallelism}",
             "#SBATCH --output=%x-%A_%a.out",
             *(f"#SBATCH {opt}" for opt in sbatch_options),
             "set -euo pipefail",
             "PYTHON=${AGENTRL_PYTHON:-python3}",
             "SOURCES=(",
             *(f"  {shlex.quote(str(s))}" for s in sources),
             ")",
             f'exec "$PYTHON" -m hpc.images.build "${{SOURCES[$SLURM_ARRAY_TASK_ID]}}" '
             f"--cache {shlex.quote(str(cache))} --format {fmt}",
             ""]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", metavar="SRC",
                   help="an OCI layout directory, an oci-archive or docker-archive tar, or a reference (python:3.11)")
    p.add_argument("--cache", required=True, help="the image cache directory (on the shared filesystem)")
    p.add_argument("--format", choices=FORMATS, default="rootfs",
                   help="rootfs: a directory for bubblewrap (default); sif: an Apptainer image (needs apptainer)")
    p.add_argument("--fakeroot", action="store_true", help="pass --fakeroot to apptainer build")


def run(args: argparse.Namespace) -> int:
    results = build_many(args.sources, ImageCache(args.cache), args.format, args.fakeroot)
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
