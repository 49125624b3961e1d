"""Make small OCI image layouts, oci-archives and docker-archives, for the tests and the image benchmark.

The pipeline itself only reads images (hpc.images.oci); this writer is here so that both can import it.

A layer is a list of `E` (one tar entry each, so hostile names can be written too) or is
made from a directory with `dir_entries` (modes, symlinks and hardlinks kept; a file named
`.wh.x` or `.wh..wh..opq` in the directory becomes a whiteout, as in a real layer diff).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

MTIME = 1_700_000_000


@dataclass
class E:
    name: str
    type: str = "file"          # file | dir | symlink | hardlink | fifo | chr
    data: bytes = b""
    mode: int = 0o644
    target: str = ""            # symlink text, or the hardlink's archive path
    mtime: int = MTIME


def dir_entries(root: Path) -> list[E]:
    """The tree under `root` as entries, parents first, names relative to `root`."""
    out: list[E] = []
    seen: dict[tuple[int, int], str] = {}
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            st = os.lstat(p)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out.append(E(rel, "symlink", target=os.readlink(p)))
            elif stat.S_ISDIR(st.st_mode):
                out.append(E(rel, "dir", mode=mode))
            elif st.st_nlink > 1 and (st.st_dev, st.st_ino) in seen:
                out.append(E(rel, "hardlink", target=seen[(st.st_dev, st.st_ino)]))
            else:
                seen[(st.st_dev, st.st_ino)] = rel
                out.append(E(rel, "file", p.read_bytes(), mode))
    return out


_TYPES = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
          "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE}


def tar_bytes(entries: list[E]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.type, info.mode, info.mtime = _TYPES[e.type], e.mode, e.mtime
            info.linkname = e.target
            if e.type == "chr":
                info.devmajor, info.devminor = 1, 3
            if e.type == "file":
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
            else:
                tar.addfile(info)
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def compress(data: bytes, how: str | None) -> tuple[bytes, str]:
    """Bytes and OCI media type of a layer tar compressed `how` (gzip, zstd or None)."""
    base = "application/vnd.oci.image.layer.v1.tar"
    if how == "gzip":
        return gzip.compress(data, mtime=0), base + "+gzip"
    if how == "zstd":
        import zstandard
        return zstandard.ZstdCompressor().compress(data), base + "+zstd"
    return data, base


def _config(tars: list[bytes], extra: dict | None = None) -> bytes:
    return json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/sh"]},
                       "rootfs": {"type": "layers", "diff_ids": [sha256(t) for t in tars]},
                       **(extra or {})}, sort_keys=True).encode()


def write_oci_layout(dest: Path, layers: list[list[E]], compression: list[str | None] | None = None,
                     ref: str | None = "latest", config_extra: dict | None = None) -> dict:
    """An OCI image layout at `dest`; returns the digests (manifest, config, layers)."""
    dest = Path(dest)
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    tars = [tar_bytes(entries) for entries in layers]
    compression = compression or ["gzip"] * len(tars)

    def put(data: bytes) -> str:
        digest = sha256(data)
        (blobs / digest.split(":")[1]).write_bytes(data)
        return digest

    layer_descs = []
    for t, how in zip(tars, compression, strict=True):
        data, media = compress(t, how)
        layer_descs.append({"mediaType": media, "digest": put(data), "size": len(data)})
    config = _config(tars, config_extra)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": put(config), "size": len(config)},
                           "layers": layer_descs}).encode()
    mdesc = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": put(manifest),
             "size": len(manifest)}
    if ref:
        mdesc["annotations"] = {"org.opencontainers.image.ref.name": ref}
    (dest / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (dest / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [mdesc]}))
    return {"manifest": mdesc["digest"], "config": sha256(config), "layers": [d["digest"] for d in layer_descs]}


def write_tar_of_dir(src: Path, dest: Path) -> Path:
    """An archive of a directory's contents (an oci-archive when `src` is an OCI layout)."""
    with tarfile.open(dest, "w") as tar:
        for p in sorted(Path(src).rglob("*")):
            tar.add(p, p.relative_to(src).as_posix(), recursive=False)
    return dest


def write_docker_archive(dest: Path, layers: list[list[E]], repo_tags: list[str] | None = None,
                         compression: list[str | None] | None = None, modern: bool = False) -> dict:
    """A `docker save` tar: legacy (<id>/layer.tar, <hex>.json) or docker >= 25 (blobs/sha256/...)."""
    tars = [tar_bytes(entries) for entries in layers]
    compression = compression or [None] * len(tars)
    config = _config(tars)
    members: dict[str, bytes] = {}
    paths = []
    for t, how in zip(tars, compression, strict=True):
        data = compress(t, how)[0]
        path = f"blobs/sha256/{sha256(data)[7:]}" if modern else f"{sha256(t)[7:]}/layer.tar"
        members[path] = data
        paths.append(path)
    config_path = f"blobs/sha256/{sha256(config)[7:]}" if modern else f"{sha256(config)[7:]}.json"
    members[config_path] = config
    members["manifest.json"] = json.dumps([{"Config": config_path, "RepoTags": repo_tags or ["task:latest"],
                                            "Layers": paths}]).encode()
    with tarfile.open(dest, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), MTIME
            tar.addfile(info, io.BytesIO(data))
    return {"config": sha256(config), "layer_paths": paths}
