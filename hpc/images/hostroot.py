"""A rootfs made from this machine's own programs, offline: an image for tests and the sandbox benchmark.

Real task images come from registries through `hpc.images.build`; this one needs no network.
It holds what a sandbox and an episode run (shell, coreutils, git, the host's Python and
its standard library) with the shared libraries they load, a generated minimal /etc, and
the mount points bwrap needs; `min_bytes` pads it with more of the host's /usr.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from hpc.sandbox.base import AGENT_GID, AGENT_UID
from hpc.sandbox.bwrap import write_minimal_etc

# What a sandbox itself runs (bwrap's init, exec, write_file), what an episode runs (git for the
# baseline and the patch) and what the bundled tasks run (bash, python3).
ESSENTIAL_BINS = ("bash", "sh", "dash", "true", "id", "cat", "sleep", "mkdir", "chmod", "dirname", "ls", "env",
                  "rm", "touch", "cp", "stat", "chown", "grep", "sed", "git", "python3", "python3.11",
                  # what the sandbox's history stripping runs (agentrl/swe/sandbox_scripts/strip_history.sh)
                  "find", "mv", "sort", "cut", "tr", "head")
STDLIB_SKIP = {"__pycache__", "config-3.11-x86_64-linux-gnu", "idlelib", "tkinter", "turtledemo", "ensurepip"}
# Bulk added after the essentials, entry by entry in this order, until the image is big enough.
FILLERS = ("/usr/lib/python3", "/usr/bin", "/usr/sbin", "/usr/lib/x86_64-linux-gnu", "/usr/share", "/usr/lib")
MOUNT_POINTS = ("proc", "dev", "tmp", "run/agentrl", "testbed", "root", "home/agent", "var/tmp", "usr/sbin")

def _tree_bytes(path: Path) -> int:
    st = path.lstat()
    total = st.st_blocks * 512
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def _copy_entry(src: str, root: Path) -> None:
    """Copy one host path (file, symlink or tree) to the same path under `root`, parents made as needed."""
    dst = root / src.lstrip("/")
    if os.path.lexists(dst):
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", src, str(dst)], check=True, capture_output=True)


def _usr_path(path: str) -> str:
    """/lib/x/libc.so.6 -> /usr/lib/x/libc.so.6 on a merged-/usr host (the file itself is not resolved)."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def _copy_chain(path: str, root: Path) -> None:
    """Copy `path` and, if it is a symlink, everything its chain of links passes through."""
    seen = set()
    p = _usr_path(path)
    while p not in seen and os.path.lexists(p):
        seen.add(p)
        _copy_entry(p, root)
        if not os.path.islink(p):
            break
        p = _usr_path(os.path.normpath(os.path.join(os.path.dirname(p), os.readlink(p))))


def _essentials(root: Path, bins: Sequence[str]) -> None:
    for name in bins:
        exe = shutil.which(name, path="/usr/bin:/bin")
        if exe is None:
            continue
        _copy_chain(exe, root)
        out = subprocess.run(["ldd", os.path.realpath(exe)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            lib = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts else ""
            if lib.startswith("/"):
                _copy_chain(lib, root)
    stdlib = f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}"
    py = Path(os.path.realpath(shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3")).name
    stdlib = f"/usr/lib/{py}" if os.path.isdir(f"/usr/lib/{py}") else stdlib
    shutil.copytree(stdlib, root / stdlib.lstrip("/"), symlinks=True, dirs_exist_ok=True,
                    ignore=lambda d, names: [n for n in names if n in STDLIB_SKIP or n == "test"])


def _skeleton(root: Path) -> None:
    (root / "usr").mkdir(parents=True, exist_ok=True)
    for d in ("bin", "sbin", "lib", "lib64"):
        if os.path.islink(f"/{d}"):
            (root / d).symlink_to(os.readlink(f"/{d}"))
    # bwrap mounts onto these; on a read-only rootfs it cannot create them itself.
    for d in MOUNT_POINTS:
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "var/tmp").chmod(0o1777)
    (root / "root").chmod(0o700)
    os.chown(root / "home/agent", AGENT_UID, AGENT_GID)
    write_minimal_etc(root / "etc")


def build_host_rootfs(root: Path, *, min_bytes: int = 0, extra_bins: Sequence[str] = ()) -> int:
    """Build the rootfs at `root` (which must not exist yet); its size in bytes on disk. `extra_bins`:
    more of the host's programs (curl, say), with the libraries they load."""
    if os.path.lexists(root):
        raise FileExistsError(f"{root} exists: a host rootfs is built into a new directory")
    _skeleton(root)
    _essentials(root, (*ESSENTIAL_BINS, *extra_bins))
    size = _tree_bytes(root)
    for filler in FILLERS:
        if size >= min_bytes or not os.path.isdir(filler):
            continue
        for name in sorted(os.listdir(filler)):
            if size >= min_bytes:
                break
            src = os.path.join(filler, name)
            if os.path.lexists(root / src.lstrip("/")):
                continue
            size += _tree_bytes(Path(src))
            _copy_entry(src, root)
    return size
