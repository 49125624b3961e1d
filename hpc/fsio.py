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
