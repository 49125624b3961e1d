"""Apply an image's layers, in order, to a rootfs directory that bubblewrap can run.

Whiteouts follow the OCI layer spec: `.wh.NAME` removes NAME of lower layers, and
`.wh..wh..opq` removes everything lower layers put in its directory; neither touches what
the same layer adds. Extraction is safe against a hostile layer: absolute names and `..` are
refused, no symlink is ever followed (a name whose parent is a symlink is refused, since
docker and buildkit record real paths in a layer diff), hardlinks point inside the rootfs,
and devices are skipped (bubblewrap gives the sandbox its own /dev). Each layer's digest is
checked while it streams in; the caller builds into a temp dir and discards it on error.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal, overload

from .oci import Image, ImageError, Layer

WHITEOUT, OPAQUE = ".wh.", ".wh..wh..opq"
_CHUNK = 1 << 20


@dataclass
class Stats:
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    whiteouts: int = 0
    skipped: list[str] = field(default_factory=list)   # devices and other types not created


class _Hashing(io.RawIOBase):
    """A reader that hashes what passes through, so a layer is verified in the same read."""

    def __init__(self, raw: IO[bytes] | io.BufferedIOBase, alg: str):
        self.raw, self.hash, self.count = raw, hashlib.new(alg), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        data = self.raw.read(len(buf))
        self.hash.update(data)
        self.count += len(data)
        buf[:len(data)] = data
        return len(data)

    def drain(self) -> str:
        while self.read(_CHUNK):
            pass
        return f"{self.hash.name}:{self.hash.hexdigest()}"


def _decompressed(stream: IO[bytes], layer: Layer) -> IO[bytes] | io.BufferedIOBase:
    """Sniff the compression (media types lie in docker-archives): gzip, zstd or plain tar."""
    head = stream.peek(4)[:4] if hasattr(stream, "peek") else b""
    if head[:2] == b"\x1f\x8b":
        import gzip
        return gzip.GzipFile(fileobj=stream, mode="rb")
    if head == b"\x28\xb5\x2f\xfd":
        try:
            import zstandard
        except ImportError:
            raise ImageError(f"{layer.name} is zstd-compressed and the Python module zstandard is not "
                             "installed: `pip install zstandard`, or recompress the image with gzip") from None
        return zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True)
    return stream


def split_name(name: str, where: str) -> list[str]:
    """The components of a member name below the rootfs; refuse absolute names and '..'."""
    if name.startswith("/"):
        raise ImageError(f"{where}: refusing absolute path {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageError(f"{where}: refusing path {name!r} (a '..' component escapes the rootfs)")
    return parts


@overload
def _parent(root: Path, parts: list[str], where: str, create: Literal[True]) -> Path: ...
@overload
def _parent(root: Path, parts: list[str], where: str, create: bool) -> Path | None: ...
def _parent(root: Path, parts: list[str], where: str, create: bool) -> Path | None:
    """The directory holding parts[-1], walking without following any symlink."""
    d = root
    for i, part in enumerate(parts[:-1]):
        d = d / part
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            if not create:
                return None
            os.mkdir(d)
            os.chmod(d, 0o755)  # a directory the layer does not list: the usual mode, whatever the umask
            continue
        if stat.S_ISLNK(st.st_mode):
            raise ImageError(f"{where}: refusing to write {'/'.join(parts)!r} through the symlink "
                             f"{'/'.join(parts[:i + 1])!r}")
        if not stat.S_ISDIR(st.st_mode):
            raise ImageError(f"{where}: {'/'.join(parts[:i + 1])!r} is not a directory")
    return d


class _Applier:
    def __init__(self, root: Path, stats: Stats):
        self.root, self.stats = root, stats
        self.dir_meta: dict[str, tarfile.TarInfo] = {}
        self.as_root = os.geteuid() == 0

    def _remove(self, rel: str) -> None:
        path = self.root / rel
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
            # A directory made again later must not get the metadata of the removed one.
            for key in [k for k in self.dir_meta if k == rel or k.startswith(rel + "/")]:
                del self.dir_meta[key]
        else:
            os.unlink(path)

    def _opaque(self, rel: str, this_layer: set[str]) -> None:
        """Remove what lower layers put under `rel`; keep what this layer added there."""
        for entry in os.scandir(self.root / rel if rel else self.root):
            sub = f"{rel}/{entry.name}" if rel else entry.name
            if sub not in this_layer:
                self._remove(sub)
            elif entry.is_dir(follow_symlinks=False):
                self._opaque(sub, this_layer)

    def layer(self, tar: tarfile.TarFile, where: str) -> None:
        this_layer: set[str] = set()
        for m in tar:
            parts = split_name(m.name, where)
            if not parts:
                continue  # the layer's own root entry
            rel, base = "/".join(parts), parts[-1]
            if base.startswith(WHITEOUT):
                self._whiteout(parts, where, this_layer)
                continue
            for i in range(1, len(parts) + 1):
                this_layer.add("/".join(parts[:i]))
            target = _parent(self.root, parts, where, create=True) / base
            self._create(tar, m, target, rel, where)

    def _whiteout(self, parts: list[str], where: str, this_layer: set[str]) -> None:
        self.stats.whiteouts += 1
        base = parts[-1]
        parent = _parent(self.root, parts, where, create=False)
        if parent is None:
            return  # nothing below to hide
        prefix = "/".join(parts[:-1])
        if base == OPAQUE:
            self._opaque(prefix, this_layer)
            return
        victim = base[len(WHITEOUT):]
        if victim in ("", ".", "..") or victim.startswith(WHITEOUT):
            raise ImageError(f"{where}: invalid whiteout {'/'.join(parts)!r}")
        if (f"{prefix}/{victim}" if prefix else victim) not in this_layer:  # only lower layers' entries
            self._remove(f"{prefix}/{victim}" if prefix else victim)

    def _create(self, tar: tarfile.TarFile, m: tarfile.TarInfo, target: Path, rel: str, where: str) -> None:
        try:
            old = os.lstat(target)
        except FileNotFoundError:
            old = None
        if m.isdir():
            if old is not None and not stat.S_ISDIR(old.st_mode):
                self._remove(rel)
                old = None
            if old is None:
                os.mkdir(target, 0o700)
            self.dir_meta[rel] = m  # a later layer's entry for the same dir wins
            self.stats.dirs += 1
            return
        if old is not None:
            self._remove(rel)
        if m.isreg():
            member = tar.extractfile(m)
            if member is None:      # tarfile gives None for anything but a regular file
                raise ImageError(f"{where}: {rel!r} cannot be read from the archive")
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out, member:
                shutil.copyfileobj(member, out, _CHUNK)
            self._meta(target, m)
            self.stats.files += 1
        elif m.issym():
            os.symlink(m.linkname, target)  # its text is never resolved here
            self._meta(target, m)
            self.stats.symlinks += 1
        elif m.islnk():
            lparts = split_name(m.linkname, where)
            src_dir = _parent(self.root, lparts, where, create=False) if lparts else None
            src = src_dir / lparts[-1] if src_dir is not None else None
            if src is None or not os.path.lexists(src) or stat.S_ISDIR(os.lstat(src).st_mode):
                raise ImageError(f"{where}: hardlink {rel!r} -> {m.linkname!r}: no such file in the rootfs")
            os.link(src, target, follow_symlinks=False)
            self.stats.hardlinks += 1
        elif m.isfifo():
            os.mkfifo(target, 0o600)
            self._meta(target, m)
        else:
            self.stats.skipped.append(rel)

    def _meta(self, path: Path, m: tarfile.TarInfo) -> None:
        link = m.issym()
        if self.as_root:
            os.chown(path, m.uid, m.gid, follow_symlinks=False)
        if not link:
            os.chmod(path, m.mode & 0o7777)  # after chown, which clears setuid bits
        os.utime(path, (m.mtime, m.mtime), follow_symlinks=False)

    def finish(self) -> None:
        # Deepest first, so setting a directory's mtime is not undone by its children.
        for rel in sorted(self.dir_meta, key=lambda r: r.count("/"), reverse=True):
            path = self.root / rel
            if os.path.isdir(path) and not os.path.islink(path):
                self._meta(path, self.dir_meta[rel])


def _check_blob(layer: Layer, outer: _Hashing) -> None:
    got = outer.drain()
    if layer.size is not None and outer.count != layer.size:
        raise ImageError(f"{layer.name}: size {outer.count} does not match the descriptor's {layer.size}")
    if layer.digest and got != layer.digest:
        raise ImageError(f"{layer.name}: content does not match its digest {layer.digest} "
                         "(corrupt or tampered blob)")


def apply_layer(layer: Layer, applier: _Applier) -> None:
    raw = layer.open()
    try:
        outer = _Hashing(raw, (layer.digest or "sha256").split(":")[0])
        buffered = io.BufferedReader(outer, _CHUNK)
        decomp = _decompressed(buffered, layer)
        inner = _Hashing(decomp, "sha256") if layer.diff_id else None
        try:
            with tarfile.open(fileobj=inner or decomp, mode="r|") as tar:
                applier.layer(tar, layer.name)
            got_diff = inner.drain() if inner else None
            while buffered.read(_CHUNK):
                pass
        except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
            if isinstance(e, OSError) and e.errno is not None:
                raise
            _check_blob(layer, outer)  # a corrupt blob is the likelier story: say so if it is
            raise ImageError(f"{layer.name}: not a valid layer archive ({e})") from None
        _check_blob(layer, outer)
        if layer.diff_id and got_diff != layer.diff_id:
            raise ImageError(f"{layer.name}: uncompressed content does not match its diff_id {layer.diff_id} "
                             "(corrupt or tampered layer)")
    finally:
        raw.close()


def _empty_dir(path: Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if any(path.iterdir()):
        raise ImageError(f"{path}: extraction needs an empty directory")
    path.chmod(0o755)
    return path


def extract_image(image: Image, rootfs: Path, progress=None) -> Stats:
    """Apply every layer of `image` to the empty or missing directory `rootfs`."""
    stats = Stats()
    applier = _Applier(_empty_dir(rootfs), stats)
    for layer in image.layers:
        apply_layer(layer, applier)
        if progress:
            progress(layer)
    applier.finish()
    return stats


class _OverlayApplier(_Applier):
    """One layer on its own, in the form overlayfs stacks: a whiteout becomes a 0/0 character device
    and an opaque directory gets the trusted.overlay.opaque xattr (both need root, as the mount does)."""

    def _whiteout(self, parts: list[str], where: str, this_layer: set[str]) -> None:
        self.stats.whiteouts += 1
        base, parent = parts[-1], _parent(self.root, parts, where, create=True)
        if base == OPAQUE:
            os.setxattr(parent, "trusted.overlay.opaque", b"y")
            return
        victim = base[len(WHITEOUT):]
        if victim in ("", ".", "..") or victim.startswith(WHITEOUT):
            raise ImageError(f"{where}: invalid whiteout {'/'.join(parts)!r}")
        rel = "/".join([*parts[:-1], victim])
        if rel not in this_layer:          # a whiteout hides lower layers' entries only
            os.mknod(parent / victim, stat.S_IFCHR | 0o600, os.makedev(0, 0))


def extract_layer(layer: Layer, tree: Path) -> Stats:
    """One layer into the empty or missing directory `tree`, in overlayfs form (see _OverlayApplier)."""
    if os.geteuid() != 0:
        raise ImageError(f"{layer.name}: the layers format needs root (its whiteouts are device nodes, as "
                         "overlayfs has them): build --format rootfs instead")
    stats = Stats()
    applier = _OverlayApplier(_empty_dir(tree), stats)
    apply_layer(layer, applier)
    applier.finish()
    return stats
