"""A bwrap sandbox's file system, built by its supervisor's child in a private mount namespace.

Before the user namespace exists (so with the host root's powers, in a mount namespace no one
else sees): the sized disk (hpc.sandbox.storage), the overlays of the image and the work tree, the image's
root handed to the sandbox's root, and the bind sources staged where that root can reach them.
Everything here vanishes with the mount namespace, however the sandbox ends.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import linux, storage
from .bwrap_args import BINDS, options
from .layers import chown_tree
from .policy import Limits, UidRange

# bwrap runs as the sandbox's root, an unprivileged host uid that may not pass the 0700 directories
# above a scratch dir, a tool dir or the adapter's socket: each bind source is bind-mounted first
# under this directory (a tmpfs in the sandbox's private mount namespace) and bwrap gets that path.
STAGE_DIR = "/run/agentrl/stage"
STORAGE_FILE = "storage.json"       # in the scratch directory: what the disk became (mount_storage)


def stage_binds(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """bwrap's argv with every bind source replaced by its staged path, and (source, staged) pairs."""
    out = list(argv)
    pairs: list[tuple[str, str]] = []
    for i, flag, args in options(argv):
        if flag in BINDS:
            staged = f"{STAGE_DIR}/{len(pairs)}"
            pairs.append((args[0], staged))
            out[i + 1] = staged
    return out, pairs


def build_file_system(cfg: dict, uids: UidRange, limits: Limits, staged: list[tuple[str, str]]) -> None:
    """Mount and hand over everything bwrap will bind (in the child, after unshare(CLONE_NEWNS))."""
    base = uids.base
    # The sandbox's root (an unprivileged host uid) must pass its scratch directory; no one else may.
    os.chown(cfg["scratch"], base, base)
    linux.mount("none", "/", None, linux.MS_REC | linux.MS_PRIVATE)
    disk = cfg["disk"]
    os.makedirs(disk, exist_ok=True)
    mount_storage(cfg["scratch"], disk, limits.storage_mb, cfg.get("storage", "auto"))
    for i, layer in enumerate(cfg["layers"]):
        upper, work = f"{disk}/layer{i}/upper", f"{disk}/layer{i}/work"
        os.makedirs(upper)
        os.makedirs(work)
        linux.mount("overlay", layer["merged"], "overlay", 0,
                    f"lowerdir={layer['source']},upperdir={upper},workdir={work},metacopy=on")
        if layer.get("owner") is not None:
            chown_tree(layer["merged"], uids.host(layer["owner"]), uids.host(layer["owner"]))
    if cfg.get("image_root"):
        prepare_image_root(cfg["image_root"], uids)
    home = Path(disk) / "home"
    home.mkdir()
    os.chown(home, uids.host(1000), uids.host(1000))
    os.chown(disk, base, base)
    linux.mount("tmpfs", STAGE_DIR, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "mode=0755,size=1m")
    for source, target in staged:
        os.mkdir(target) if os.path.isdir(source) else open(target, "w").close()
        linux.mount(source, target, None, linux.MS_BIND | linux.MS_REC)


def mount_storage(scratch: str, disk: str, storage_mb: int | None, mode: str) -> None:
    """The disk that holds the writable layers and HOME (hpc.sandbox.storage): a disk image where
    the node can, else a tmpfs; what it became, and why not a disk image, goes to STORAGE_FILE
    for the supervisor to report."""
    backing, why = storage.choose(mode, storage_mb)  # type: ignore[arg-type]
    if backing == "disk":
        try:
            storage.mount_disk_image(scratch, disk, storage_mb or 0)
        except storage.StorageError as e:
            if mode == "disk":
                raise
            backing, why = "tmpfs", str(e)
    if backing == "tmpfs":
        linux.mount("tmpfs", disk, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, f"size={storage_mb}m,mode=0755")
    Path(scratch, STORAGE_FILE).write_text(json.dumps({"backing": backing, "why": why}))


def prepare_image_root(image: dict, uids: UidRange) -> None:
    """bwrap makes its mount points as the sandbox's root, which owns nothing of an image: they
    (and the dirs grading writes to) are made here and handed to that root; an image's own
    work tree is handed to the agent."""
    base, root = uids.base, Path(image["path"])
    if image.get("agent_tree"):
        tree = root / image["agent_tree"].lstrip("/")
        if tree.is_dir():
            chown_tree(tree, uids.host(1000), uids.host(1000))
    for rel, kind in image["mountpoints"]:
        p = root / rel.lstrip("/")
        for parent in reversed([q for q in p.parents if root in q.parents]):
            if not os.path.lexists(parent):
                parent.mkdir()
                os.lchown(parent, base, base)
        if not os.path.lexists(p):
            p.mkdir() if kind == "dir" else p.touch()
        os.lchown(p, base, base)
