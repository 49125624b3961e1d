"""A bwrap sandbox's disk: what holds its writable layers and HOME, sized to the task's `storage_mb`.

    disk     a sparse ext4 image in the sandbox's scratch directory on node-local disk, mounted
             through a loop device in the sandbox's private mount namespace. Writing past
             storage_mb is ENOSPC; what the agent writes is page cache, which the kernel writes
             back and reclaims instead of killing a process for it.
    tmpfs    the fallback, where a node has no loop devices (or no mkfs.ext4): the same size
             limit, but every byte written is RAM charged to the sandbox's memory cgroup, so a
             large write there can end in the OOM killer instead of ENOSPC.

`auto` (the default) takes `disk` where the node supports it and says once why it fell back
otherwise. The loop device is set up by mount(8) with autoclear: it goes with the last mount,
that is with the sandbox's mount namespace, however the sandbox ends. No storage_mb: the layers
live unbounded in the scratch directory itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Literal, get_args

StorageMode = Literal["auto", "disk", "tmpfs"]
STORAGE_MODES: tuple[str, ...] = get_args(StorageMode)
IMAGE_NAME = "disk.img"
# No reserved blocks (no other user of this filesystem), no journal (it never outlives a crash
# worth recovering from), inode tables left to read as the sparse file's zeros.
MKFS_ARGS = ("-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard")
MOUNT_OPTIONS = "loop,nosuid,nodev,noatime,noinit_itable"
_MKFS_TIMEOUT_S = 60


class StorageError(RuntimeError):
    """The disk the sandbox was asked for cannot be made on this node."""


def check_mode(mode: str) -> StorageMode:
    if mode not in STORAGE_MODES:
        raise ValueError(f"sandbox storage must be one of {', '.join(STORAGE_MODES)}, got {mode!r}")
    return mode  # type: ignore[return-value]


def disk_unsupported() -> str | None:
    """Why this node cannot give a sandbox a disk image (None: it can)."""
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices on this node (/dev/loop-control is missing: modprobe loop)"
    for tool, pkg in (("mkfs.ext4", "e2fsprogs"), ("mount", "mount")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: apt-get install {pkg})"
    return None


def mkfs_argv(image: str) -> list[str]:
    return ["mkfs.ext4", *MKFS_ARGS, image]


def mount_argv(image: str, target: str) -> list[str]:
    return ["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, image, target]


def mount_disk_image(scratch: str, target: str, size_mb: int) -> None:
    """A sparse ext4 image of `size_mb` in `scratch`, mounted at `target` (in a private mount
    namespace, as the host's root). Raises StorageError saying what failed."""
    image = os.path.join(scratch, IMAGE_NAME)
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    for argv, what in ((mkfs_argv(image), "making its filesystem"), (mount_argv(image, target), "mounting it")):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=_MKFS_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise StorageError(f"the sandbox's disk image {image}: {what} failed: {e}") from None
        if r.returncode != 0:
            raise StorageError(f"the sandbox's disk image {image}: {what} failed ({' '.join(argv[:1])} exited "
                               f"{r.returncode}): {(r.stderr or r.stdout).strip()[-500:]}")


def choose(mode: StorageMode, storage_mb: int | None) -> tuple[str, str | None]:
    """(what backs the disk: "disk", "tmpfs" or "dir", why it is not a disk image where one was
    asked for). Pure apart from probing the node's tools; raises StorageError for mode "disk"
    on a node that cannot."""
    check_mode(mode)
    if not storage_mb:
        return "dir", None
    if mode == "tmpfs":
        return "tmpfs", None
    why = disk_unsupported()
    if why is None:
        return "disk", None
    if mode == "disk":
        raise StorageError(f"sandbox storage: disk was asked for, but {why}")
    return "tmpfs", why


def fallback_message(why: str) -> str:
    return (f"sandbox disks are tmpfs on this node ({why}): what an agent writes to its work tree and "
            "HOME is RAM charged to its memory limit, and a large write ends in the OOM killer instead of "
            "'No space left on device'. Give the node loop devices and mkfs.ext4, or set "
            "pool.sandbox_storage: tmpfs to say this is meant")
