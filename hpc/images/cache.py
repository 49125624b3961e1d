"""A content-addressed cache of built images on the shared filesystem.

    CACHE/<format>/<alg>-<hex>/          one image (the config digest) in one format
        image.json                       ImageEntry record, written last
        rootfs/  or  image.sif
    CACHE/<format>/.tmp-<host>-<pid>-<rand>/   a build in progress

A build happens in a temp dir beside its entry and is renamed into place whole: rename(2)
of a directory is atomic on local filesystems, NFS, Lustre and GPFS, and fails when the
target is a non-empty directory, so of two builders of one image the first rename wins and
the other discards its copy and uses the winner's. A reader trusts only an entry whose
record is there and names the same digest and format. The directory is named
`sha256-<hex>`, not `sha256:<hex>`: a colon would split `--bind src:dst` specs.
"""

from __future__ import annotations

import builtins
import errno
import os
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hpc.fsio import fsync_dir
from hpc.procs import pid_alive
from hpc.records import Record, RecordError, read_record, write_record

from .oci import check_digest

FORMATS = ("rootfs", "sif", "layers")     # what `agentrl images build --format` makes
Format = Literal["rootfs", "sif", "layers", "layer"]
RECORD = "image.json"
# layers: a text file of the image's layers (diff ids, lowest first), each a "layer" entry: a directory
# in overlayfs form (whiteouts as 0/0 devices, opaque directories by xattr) that a sandbox stacks
PAYLOAD = {"rootfs": "rootfs", "sif": "image.sif", "layers": "layers", "layer": "tree"}
STALE_S = 6 * 3600  # a temp dir untouched this long on another host is an abandoned build


class ImageEntry(Record):
    kind: Literal["image_cache_entry"] = "image_cache_entry"
    schema_version: int = 1
    digest: str            # the image id: digest of its config
    format: Format
    source: str            # what it was built from, for people
    manifest_digest: str | None = None
    size: int              # bytes of the built payload
    created: float
    # The image's runtime config (OCI config.Env, WorkingDir, User), which a rootfs alone loses
    env: dict[str, str] = {}
    workdir: str | None = None
    user: str | None = None


# Refuses a built payload (raising) before it is published: (the payload, the image's runtime config)
Verify = Callable[[Path, Mapping[str, Any]], None]


class CacheError(Exception):
    pass


@dataclass(frozen=True)
class Entry:
    path: Path             # the entry directory
    record: ImageEntry

    @property
    def payload(self) -> Path:
        """The rootfs directory or the .sif file."""
        return self.path / PAYLOAD[self.record.format]


def _dirname(digest: str) -> str:
    alg, hexd = check_digest(digest, "image cache key")
    return f"{alg}-{hexd}"


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_size
    return total



def _make_writable(path: str) -> None:
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            os.chmod(entry.path, 0o700)
            _make_writable(entry.path)


def _rmtree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except PermissionError:  # an image's read-only directories, when we are not root
        os.chmod(path, 0o700)
        _make_writable(str(path))
        shutil.rmtree(path)


class ImageCache:
    def __init__(self, root: Path | str, stale_s: float = STALE_S):
        self.root, self.stale_s = Path(root), stale_s

    def entry_path(self, digest: str, fmt: Format) -> Path:
        if fmt not in PAYLOAD:
            raise CacheError(f"unknown image format {fmt!r} (one of {', '.join(FORMATS)})")
        return self.root / fmt / _dirname(digest)

    def _valid(self, path: Path, digest: str | None, fmt: str) -> Entry | None:
        try:
            rec = read_record(path / RECORD, ImageEntry)
        except RecordError:
            return None
        if rec.format != fmt or rec.digest != (digest or rec.digest):
            return None
        if digest is None and path.name != _dirname(rec.digest):
            return None
        if not os.path.lexists(path / PAYLOAD[fmt]):
            return None
        return Entry(path, rec)

    def lookup(self, digest: str, fmt: Format) -> Entry | None:
        """The complete entry for this image and format, or None."""
        return self._valid(self.entry_path(digest, fmt), digest, fmt)

    def list(self, fmt: Format | None = None) -> list[Entry]:
        out = []
        for f in [fmt] if fmt else FORMATS:
            d = self.root / f
            if d.is_dir():
                out += [e for p in sorted(d.iterdir()) if not p.name.startswith(".")
                        and (e := self._valid(p, None, f)) is not None]
        return out

    def find(self, source: str, fmt: Format) -> Entry | None:
        """The newest complete entry built from `source` (as `build_image` was given it), or None."""
        if fmt not in FORMATS:
            raise CacheError(f"unknown image format {fmt!r} (one of {', '.join(FORMATS)})")
        hits = [e for e in self.list(fmt) if e.record.source == source]
        return max(hits, key=lambda e: e.record.created, default=None)

    def layer_dirs(self, entry: Entry | Path) -> builtins.list[Path]:     # builtins: `list` is a method here
        """The layer directories of a "layers" entry (or of its payload, the list of its layers), top
        first, as overlayfs's lowerdir lists them."""
        payload = entry.payload if isinstance(entry, Entry) else entry
        dirs = []
        for diff_id in reversed(payload.read_text().split()):
            layer = self.lookup(diff_id, "layer")
            if layer is None:
                raise CacheError(f"{payload.parent}: its layer {diff_id} is not in the cache (removed by hand?): "
                                 f"remove {payload.parent} and build the image again")
            dirs.append(layer.payload)
        return dirs

    def _aside(self, path: Path) -> Path | None:
        """Rename `path` to a private trash name (atomic), or None if it is gone already."""
        trash = path.parent / f".trash-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return None
        return trash

    def remove(self, digest: str, fmt: Format) -> bool:
        """Remove an entry; readers that already hold its path keep the files until they are gone."""
        trash = self._aside(self.entry_path(digest, fmt))
        if trash is None:
            return False
        _rmtree(trash)
        return True

    def clean_temps(self, fmt: Format) -> builtins.list[Path]:
        """Remove abandoned builds: a dead pid on this host, or untouched for stale_s elsewhere."""
        removed: builtins.list[Path] = []
        d = self.root / fmt
        if not d.is_dir():
            return removed
        host, now = socket.gethostname(), time.time()
        for p in d.iterdir():
            if not p.name.startswith((".tmp-", ".trash-")):
                continue
            try:
                kind, rest = p.name[1:].split("-", 1)
                owner, pid_s, _rand = rest.rsplit("-", 2)
                pid = int(pid_s)
                age = now - os.lstat(p).st_mtime
            except (ValueError, FileNotFoundError):
                continue
            if kind == "trash" or (owner == host and not pid_alive(pid)) or age > self.stale_s:
                if (owner, pid) == (host, os.getpid()):
                    continue  # our own build in progress
                _rmtree(p)
                removed.append(p)
        return removed

    def build_or_get(self, digest: str, fmt: Format, source: str, build: Callable[[Path], object],
                     manifest_digest: str | None = None, runtime: Mapping[str, Any] | None = None,
                     verify: Verify | None = None) -> tuple[Entry, bool]:
        """The entry for `digest`, built with `build(payload_path)` if absent; True if this call's build is it.
        `runtime`: the image's env, workdir and user (oci.runtime_config), kept in the entry's record.
        `verify(payload, runtime)` may refuse the build (raising) before anything is published."""
        final = self.entry_path(digest, fmt)
        hit = self.lookup(digest, fmt)
        if hit is not None:
            return hit, False
        final.parent.mkdir(parents=True, exist_ok=True)
        self.clean_temps(fmt)
        tmp = final.parent / f".tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            payload = tmp / PAYLOAD[fmt]
            build(payload)
            if not os.path.lexists(payload):
                raise CacheError(f"building {source} produced no {payload.name}")
            if verify is not None:
                verify(payload, runtime or {})
            record = ImageEntry(digest=digest, format=fmt, source=source, manifest_digest=manifest_digest,
                                size=tree_size(payload), created=time.time(), **(runtime or {}))
            write_record(tmp / RECORD, record)  # last: a directory without it is never trusted
            return self._publish(tmp, final, digest, fmt)
        finally:
            if tmp.exists():
                _rmtree(tmp)

    def _publish(self, tmp: Path, final: Path, digest: str, fmt: Format) -> tuple[Entry, bool]:
        for _ in range(3):
            try:
                os.rename(tmp, final)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                winner = self.lookup(digest, fmt)
                if winner is not None:
                    return winner, False  # another builder got there first: ours is discarded by the caller
                # Not a valid entry (copied in by hand, or damaged): set it aside and try again.
                trash = self._aside(final)
                if trash is not None:
                    if self._valid(trash, digest, fmt) is not None:  # it became valid meanwhile: put it back
                        try:
                            os.rename(trash, final)
                        except OSError:
                            pass
                    if trash.exists():
                        _rmtree(trash)
                continue
            fsync_dir(final.parent)
            entry = self.lookup(digest, fmt)
            if entry is None:
                raise CacheError(f"{final}: published but not readable")
            return entry, True
        raise CacheError(f"{final}: could not publish the build (the entry keeps changing under us)")
