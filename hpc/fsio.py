"""Atomic file writes for a shared filesystem.

A file that others read appears whole or not at all: write a temp file in the
same directory, fsync it, then rename (replace) or link (must not replace).
link(2) is the exclusive create that stays atomic on NFS, unlike O_EXCL on old
clients, so every "create if absent" here goes through it.
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import time
from pathlib import Path

_HOST = socket.gethostname()


def temp_path(path: Path, temp_dir: Path | None = None) -> Path:
    """A name beside `path` (or in `temp_dir`, same filesystem) that no other writer can pick."""
    name = f".{path.name}.tmp-{_HOST}-{os.getpid()}-{secrets.token_hex(4)}"
    return (temp_dir or path.parent) / name


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (before a rename publishes the tree)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def _write_temp(path: Path, data: bytes, fsync: bool, mtime: float | None,
                temp_dir: Path | None = None) -> Path:
    tmp = temp_path(path, temp_dir)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    if mtime is not None:
        os.utime(tmp, (mtime, mtime))
    return tmp


def read_bytes(path: Path, tries: int = 4) -> bytes:
    """The bytes of `path`, a file that another node may replace by rename (write_atomic).

    A network filesystem's client can keep a replaced file's name in its entry cache: opening it then
    fails (ESTALE, or ENOENT) until that cache times out (1 s on GlusterFS's FUSE client, 3 s with
    `--entry-timeout=3`), though the file is there all along; and a read can lose its file to the next
    replace (ESTALE). Listing the directory looks its names up afresh (readdirplus), so the next open
    reads the file, or finds it truly gone. Not always: replaced every 10 ms, a record read continuously
    failed 1 read in 7, and 1 in 300 failed four tries, so a reader that must not miss one keeps what it
    last read (hpc.registry). A file truly absent costs `tries` - 1 listings.
    """
    for _ in range(tries - 1):
        try:
            return path.read_bytes()
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ESTALE):
                raise
        os.listdir(path.parent)
    return path.read_bytes()


def write_atomic(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Write `path` whole, replacing any earlier version."""
    tmp = _write_temp(path, data, fsync, None)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    if fsync:
        fsync_dir(path.parent)


def write_new(path: Path, data: bytes, *, fsync: bool = True, mtime: float | None = None,
              temp_dir: Path | None = None) -> bool:
    """Create `path` whole if it does not exist. Returns False, changing nothing, if it does.

    `mtime`, when given, is set before the file appears, so no reader sees another value.
    `temp_dir` (a private directory on the same filesystem) keeps the temp file's
    create and unlink out of a directory that many writers share: on a busy
    directory those contend for its lock more than the link itself.
    """
    tmp = _write_temp(path, data, fsync, mtime, temp_dir)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    if fsync:
        fsync_dir(path.parent)
    return True


def probe_links(directory: Path) -> None:
    """Raise OSError unless exclusive create by link(2) works in `directory`."""
    src = temp_path(directory / "probe")
    dst = temp_path(directory / "probe-link")
    src.write_bytes(b"probe")
    try:
        os.link(src, dst)
        try:
            os.link(src, dst)
        except FileExistsError:
            pass
        else:  # pragma: no cover - a filesystem that replaces on link
            raise OSError(errno.ENOTSUP, "link(2) replaced an existing file")
        if os.stat(src).st_nlink != 2:
            raise OSError(errno.ENOTSUP, "link(2) did not create a second name for the file")
    finally:
        for p in (src, dst):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def probe_filesystem(directory: Path) -> list[str]:
    """What the run directory's file contracts need and `directory`'s filesystem lacks, each said with
    its fix ([] : nothing): link(2) that creates exclusively (claims, commits, manifests), rename(2)
    that replaces (shards, the registry), mtimes kept as set (lease deadlines), and fsync."""
    problems = []
    try:
        probe_links(directory)
    except OSError as e:
        problems.append(f"link(2) does not create files exclusively here ({e.strerror or e}): the ledger's "
                        "claims and commits need it. Use a POSIX filesystem (NFSv3+, Lustre, GPFS, BeeGFS, "
                        "or local disk); on a FUSE filesystem, one that supports hard links")
    a, b = temp_path(directory / "probe-rename"), temp_path(directory / "probe-rename")
    deadline = int(time.time()) + 3600          # a lease deadline an hour ahead, as the ledger sets them
    try:
        a.write_bytes(b"old")
        b.write_bytes(b"new")
        os.rename(b, a)
        if a.read_bytes() != b"new":
            problems.append("rename(2) did not replace the file it was renamed onto: shards and the service "
                            "registry are published by rename. Use a POSIX filesystem")
        os.utime(a, (deadline, deadline))
        if abs(os.stat(a).st_mtime - deadline) > 1:
            problems.append(f"a file's mtime set to {deadline} reads back as {os.stat(a).st_mtime:.0f}: the "
                            "ledger keeps lease deadlines in mtimes. Use a filesystem that keeps the times set "
                            "(not one mounted with a time-rewriting option)")
        fd = os.open(a, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(directory)
    except OSError as e:
        problems.append(f"{e.strerror or e} ({getattr(e, 'filename', None) or directory}): rename, utime "
                        "and fsync must work in the run directory")
    finally:
        for p in (a, b):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
    return problems
