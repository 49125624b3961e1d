"""Read a task image: an OCI image layout (a directory or an oci-archive tar) or a docker-archive tar.

Both end as an `Image`: its id (the config digest), the layers in order, and how to open each
one. Small JSON blobs are verified here as they are read; layer blobs are verified while they
are streamed into the rootfs (`hpc.images.extract`), so a large image is read once.

The image id is the digest of the config, not of the manifest, because the config names the
uncompressed layers (rootfs.diff_ids): the same image saved by `docker save` (no manifest
digest at all), copied by skopeo, or recompressed keeps one id, and so one cache entry.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import platform
import re
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

INDEX_TYPES = {"application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json"}
_DIGEST = re.compile(r"^(sha256|sha512):([0-9a-f]+)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEX_LEN = {"sha256": 64, "sha512": 128}
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


class ImageError(Exception):
    """An image that cannot be used; the message names the source and the blob or file."""


@dataclass(frozen=True)
class Layer:
    name: str                       # where it lives, for messages (a blob path)
    digest: str | None              # of the stored bytes (OCI descriptors); None in a legacy docker-archive
    diff_id: str | None             # of the uncompressed tar, from the config
    size: int | None
    open: Callable[[], IO[bytes]]


@dataclass(frozen=True)
class Image:
    source: str
    kind: str                       # "oci-layout" | "oci-archive" | "docker-archive"
    image_id: str                   # digest of the config
    manifest_digest: str | None
    config: dict
    layers: tuple[Layer, ...]

    @property
    def size(self) -> int:
        return sum(layer.size or 0 for layer in self.layers)


def runtime_config(config: dict, where: str) -> dict[str, Any]:
    """The image's runtime config (OCI image config: Env, WorkingDir, User) as ImageEntry keeps it."""
    c = config.get("config") or {}
    env: dict[str, str] = {}
    for item in c.get("Env") or []:
        name, sep, value = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not sep or not _ENV_NAME.match(name) or "\0" in value:
            raise ImageError(f"{where}: config Env entry {item!r} is not NAME=VALUE with a shell variable name")
        env[name] = value
    workdir, user = c.get("WorkingDir") or None, c.get("User") or None
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        raise ImageError(f"{where}: config WorkingDir {workdir!r} is not an absolute path")
    if user is not None and not isinstance(user, str):
        raise ImageError(f"{where}: config User {user!r} is not a string")
    return {"env": env, "workdir": workdir, "user": user}


def check_digest(digest: str | None, where: str) -> tuple[str, str]:
    """Split 'alg:hex'; refuse anything else, since the hex becomes a path (blobs/alg/hex)."""
    m = _DIGEST.match(digest or "")
    if not m or len(m.group(2)) != _HEX_LEN[m.group(1)]:
        raise ImageError(f"{where}: {digest!r} is not a sha256/sha512 digest")
    return m.group(1), m.group(2)


def digest_of(data: bytes, alg: str = "sha256") -> str:
    return f"{alg}:{hashlib.new(alg, data).hexdigest()}"


class _Store:
    """Files of a directory, or members of a tar (possibly compressed), by relative path."""

    def __init__(self, root: Path, tar: tarfile.TarFile | None):
        self.root, self.tar = root, tar

    def where(self, rel: str) -> str:
        return f"{self.root}:{rel}" if self.tar else str(self.root / rel)

    def exists(self, rel: str) -> bool:
        if self.tar is None:
            return (self.root / rel).is_file()
        return self._member(rel) is not None

    def _member(self, rel: str) -> tarfile.TarInfo | None:
        if self.tar is None:
            return None
        for name in (rel, "./" + rel):
            with contextlib.suppress(KeyError):
                member = self.tar.getmember(name)
                return member if member.isfile() else None
        return None

    def open(self, rel: str) -> IO[bytes]:
        if self.tar is None:
            try:
                return open(self.root / rel, "rb")
            except FileNotFoundError:
                raise ImageError(f"{self.where(rel)} is missing") from None
        member = self._member(rel)
        if member is None:
            raise ImageError(f"{self.where(rel)} is missing (not a file in the archive)")
        f = self.tar.extractfile(member)
        if f is None:     # not for a regular file, which _member is
            raise ImageError(f"{self.where(rel)} is not a file in the archive")
        return f

    def read(self, rel: str, digest: str | None = None, size: int | None = None) -> bytes:
        with self.open(rel) as f:
            data = f.read()
        if size is not None and len(data) != size:
            raise ImageError(f"{self.where(rel)}: size {len(data)} does not match the descriptor's {size}")
        if digest is not None and digest_of(data, digest.split(":")[0]) != digest:
            raise ImageError(f"{self.where(rel)}: content does not match its digest {digest} "
                             "(corrupt or tampered blob)")
        return data

    def json(self, rel: str, digest: str | None = None, size: int | None = None) -> dict:
        try:
            return json.loads(self.read(rel, digest, size))
        except ValueError as e:
            raise ImageError(f"{self.where(rel)} is not valid JSON ({e})") from None


def _blob_path(digest: str | None, where: str) -> str:
    alg, hexd = check_digest(digest, where)
    return f"blobs/{alg}/{hexd}"


def _pick(manifests: list[dict], where: str, ref: str | None) -> dict:
    """The one manifest of an index: by ref name if given, else the only one, else this host's platform."""
    if ref is not None:
        named = [m for m in manifests if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref]
        if not named:
            raise ImageError(f"{where}: no manifest is named {ref!r}")
        manifests = named
    if len(manifests) == 1:
        return manifests[0]
    arch = _ARCH.get(platform.machine(), platform.machine())
    ours = [m for m in manifests if m.get("platform", {}).get("os") == "linux"
            and m.get("platform", {}).get("architecture") == arch]
    if len(ours) == 1:
        return ours[0]
    names = [m.get("annotations", {}).get("org.opencontainers.image.ref.name", m.get("digest")) for m in manifests]
    raise ImageError(f"{where}: holds {len(manifests)} images ({', '.join(map(str, names))}); choose one with a ref")


def _read_oci(store: _Store, source: str, kind: str, ref: str | None) -> Image:
    if not store.exists("oci-layout"):
        raise ImageError(f"{store.where('oci-layout')} is missing: not an OCI image layout")
    desc = _pick(store.json("index.json").get("manifests") or [], store.where("index.json"), ref)
    for _ in range(4):  # an index may point at a nested index (multi-platform images)
        where = f"{source}: manifest {desc.get('digest')}"
        doc = store.json(_blob_path(desc.get("digest"), where), desc["digest"], desc.get("size"))
        if desc.get("mediaType") not in INDEX_TYPES and doc.get("mediaType") not in INDEX_TYPES:
            break
        desc = _pick(doc.get("manifests") or [], where, None)
    else:
        raise ImageError(f"{source}: image indexes nested too deep")
    manifest_digest = desc["digest"]
    cdesc = doc.get("config") or {}
    cpath = _blob_path(cdesc.get("digest"), f"{source}: config of manifest {manifest_digest}")
    config = store.json(cpath, cdesc["digest"], cdesc.get("size"))
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    ldescs = doc.get("layers") or []
    if diff_ids and len(diff_ids) != len(ldescs):
        raise ImageError(f"{store.where(cpath)}: {len(diff_ids)} diff_ids for {len(ldescs)} layers")
    layers = []
    for i, ld in enumerate(ldescs):
        rel = _blob_path(ld.get("digest"), f"{source}: layer {i} of manifest {manifest_digest}")
        layers.append(Layer(store.where(rel), ld["digest"], diff_ids[i] if diff_ids else None,
                            ld.get("size"), functools.partial(store.open, rel)))
    return Image(source, kind, cdesc["digest"], manifest_digest, config, tuple(layers))


def _read_docker(store: _Store, source: str, ref: str | None) -> Image:
    entries = store.json("manifest.json")
    if not isinstance(entries, list) or not entries:
        raise ImageError(f"{store.where('manifest.json')} lists no image")
    if ref is not None:
        entries = [e for e in entries if ref in (e.get("RepoTags") or [])]
        if not entries:
            raise ImageError(f"{store.where('manifest.json')}: no image is tagged {ref!r}")
    if len(entries) > 1:
        tags = [", ".join(e.get("RepoTags") or ["<untagged>"]) for e in entries]
        raise ImageError(f"{store.where('manifest.json')} holds {len(entries)} images ({'; '.join(tags)}): "
                         "choose one with a ref (a RepoTag)")
    entry = entries[0]
    config_bytes = store.read(entry["Config"])
    # The config file is named by its digest (legacy: <hex>.json; docker >= 25: blobs/sha256/<hex>):
    # a name that disagrees with the content is a corrupt archive.
    image_id = digest_of(config_bytes)
    named = Path(entry["Config"]).name.removesuffix(".json")
    if re.fullmatch(r"[0-9a-f]{64}", named) and named != image_id.split(":")[1]:
        raise ImageError(f"{store.where(entry['Config'])}: content does not match its digest sha256:{named}")
    config = json.loads(config_bytes)
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    paths = entry.get("Layers") or []
    if len(diff_ids) != len(paths):
        raise ImageError(f"{store.where(entry['Config'])}: {len(diff_ids)} diff_ids for {len(paths)} layers")
    layers = []
    for rel, diff_id in zip(paths, diff_ids, strict=True):
        check_digest(diff_id, store.where(entry["Config"]))
        # docker >= 25 stores layers as blobs/sha256/<hex>: that name is the stored bytes' digest.
        m = re.fullmatch(r"blobs/(sha256)/([0-9a-f]{64})", rel)
        layers.append(Layer(store.where(rel), f"{m.group(1)}:{m.group(2)}" if m else None, diff_id, None,
                            functools.partial(store.open, rel)))
    return Image(source, "docker-archive", image_id, None, config, tuple(layers))


@contextlib.contextmanager
def open_image(source: str | Path, ref: str | None = None) -> Iterator[Image]:
    """The image at `source` (an OCI layout directory, an oci-archive or a docker-archive tar).

    Layers can be opened only inside the `with` block (an archive stays open until then).
    """
    path = Path(source)
    if path.is_dir():
        store = _Store(path, None)
        if store.exists("manifest.json") and not store.exists("oci-layout"):
            yield _read_docker(store, str(path), ref)
        else:
            yield _read_oci(store, str(path), "oci-layout", ref)
        return
    if not path.is_file():
        raise ImageError(f"{path}: no such file or directory")
    try:
        tar = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise ImageError(f"{path}: not a tar archive ({e})") from None
    with tar:
        store = _Store(path, tar)
        # docker >= 25 writes both manifest.json and an OCI layout: manifest.json names the image.
        if store.exists("manifest.json"):
            yield _read_docker(store, str(path), ref)
        else:
            yield _read_oci(store, str(path), "oci-archive", ref)
