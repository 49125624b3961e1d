"""The writable copy-on-write layer of a sandbox over a read-only image or work tree.

For the Apptainer and local runtimes (the bwrap runtime's supervisor mounts its own layers in
the sandbox's private mount namespace: hpc/sandbox/layout.py). Two kinds:
- overlay: a kernel overlayfs (root only here), with metacopy so that handing the tree to the
  agent's uid copies metadata, not file data; ready in milliseconds whatever the tree's size.
- copy: a reflink copy where the filesystem supports it (XFS, Btrfs), else a plain copy;
  works unprivileged, costs time in proportion to the tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .scratch import make_scratch


class LayerError(RuntimeError):
    pass


@dataclass
class Layer:
    """A writable view (`path`) of `source`; `close()` removes every trace of it."""

    source: Path
    path: Path
    scratch: Path
    kind: str

    def close(self) -> None:
        if self.kind == "overlay":
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        shutil.rmtree(self.scratch, ignore_errors=True)


def chown_tree(path: Path | str, uid: int | None, gid: int | None) -> None:
    # An image keeps its owners (and its setuid bits, which chown clears): only a work tree
    # handed to the agent is chowned, and uid None means "leave as is".
    if uid is None or gid is None:
        return
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(path)], check=True, capture_output=True)


def _overlay_dirs(source: Path, scratch: Path) -> tuple[Path, str]:
    upper, work, merged = scratch / "upper", scratch / "work", scratch / "merged"
    for d in (upper, work, merged):
        d.mkdir(parents=True)
    return merged, f"lowerdir={source},upperdir={upper},workdir={work},metacopy=on"


def overlay_layer(source: Path, scratch: Path, uid: int | None, gid: int | None) -> Layer:
    merged, opts = _overlay_dirs(source, scratch)
    r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise LayerError(f"overlay mount failed: {r.stderr.strip()}")
    layer = Layer(source, merged, scratch, "overlay")
    try:
        chown_tree(merged, uid, gid)
    except subprocess.CalledProcessError as e:
        layer.close()
        raise LayerError(f"chown in the overlay failed: {e.stderr}") from None
    return layer


def copy_layer(source: Path, scratch: Path, uid: int | None, gid: int | None) -> Layer:
    dest = scratch / "tree"
    r = subprocess.run(["cp", "-a", "--reflink=auto", str(source), str(dest)], capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise LayerError(f"copying {source} failed: {r.stderr.strip()}")
    if os.geteuid() == 0:
        chown_tree(dest, uid, gid)
    return Layer(source, dest, scratch, "copy")


def make_layer(source: Path, scratch_root: str | None, uid: int | None, gid: int | None,
               kind: str = "auto") -> Layer:
    """A writable layer over `source`: overlay where this process may mount, else a copy."""
    if not source.is_dir():
        raise LayerError(f"{source} is not a directory")
    scratch = make_scratch("layer", scratch_root)
    if kind == "overlay" or (kind == "auto" and os.geteuid() == 0):
        try:
            return overlay_layer(source, scratch, uid, gid)
        except LayerError:
            if kind == "overlay":
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            shutil.rmtree(scratch, ignore_errors=True)
            scratch = make_scratch("layer", scratch_root)
    return copy_layer(source, scratch, uid, gid)
