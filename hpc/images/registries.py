"""Where an image reference is pulled from, under a site's registries.conf (containers-registries.conf(5)).

buildah and skopeo read the file themselves; Apptainer's `Bootstrap: docker` does not, so an
Apptainer definition names the registry that the file would have chosen.
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib


def qualified(ref: str, search: list[str]) -> str:
    """A reference with its registry: a short name takes the first unqualified-search registry (Docker
    Hub's `library/` for one-component names), as containers-registries.conf(5) resolves it."""
    first = ref.split("/", 1)[0]
    if "/" in ref and ("." in first or ":" in first or first == "localhost"):
        return ref
    registry = search[0] if search else "docker.io"
    if registry == "docker.io" and "/" not in ref:
        ref = f"library/{ref}"
    return f"{registry}/{ref}"


def search_registries(registries_conf: str | None) -> list[str]:
    """A registries.conf's unqualified-search-registries (Docker Hub where it names none)."""
    conf = tomllib.loads(registries_conf) if registries_conf else {}
    return list(conf.get("unqualified-search-registries") or ["docker.io"])


def mirror_reference(ref: str, registries_conf: str | None) -> tuple[str, bool]:
    """(where to pull `ref` from, whether that registry is plain HTTP) under a registries.conf: the
    [[registry]] with the longest matching prefix, its first mirror if it lists one, else its location.
    Apptainer's `Bootstrap: docker` reads no registries.conf, so the definition names the place itself."""
    conf = tomllib.loads(registries_conf) if registries_conf else {}
    full = qualified(ref, list(conf.get("unqualified-search-registries") or []))
    best = None
    for reg in conf.get("registry") or []:
        prefix = reg.get("prefix") or reg.get("location") or ""
        if prefix and (full == prefix or full.startswith(prefix.rstrip("/") + "/") or full.startswith(prefix + ":")) \
                and (best is None or len(prefix) > len(best[0])):
            best = (prefix, reg)
    if best is None:
        return full, False
    prefix, reg = best
    target = (reg.get("mirror") or [None])[0] or reg
    location = target.get("location") or prefix
    return location + full[len(prefix):], bool(target.get("insecure", False))
