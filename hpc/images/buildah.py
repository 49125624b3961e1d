"""A task's environment built from its Dockerfile with buildah, without a Docker daemon.

    buildah [--root R --runroot R/run] [--storage-driver D] bud --isolation chroot -f CTX/Dockerfile -t TAG CTX
    buildah push TAG oci-archive:TMP.tar         then the archive becomes a cache entry (rootfs or SIF)

`--isolation chroot` runs RUN steps without a container runtime or user namespaces, which is
what works inside a Slurm job. A site registry or pull-through mirror is a registries.conf
(containers-registries.conf(5)), handed to buildah as CONTAINERS_REGISTRIES_CONF, so that a
Dockerfile's unchanged `FROM swebench/...` resolves through it.

The build's whole output goes to a log in the cache (CACHE/logs/<key>.log). A RUN step that
could not reach the network fails the build even when the step exited 0, since `curl ... | sh`
exits with sh's status: the image would silently lack what the download was for.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from .bases import pulled_base
from .build import build_image, require_tool
from .cache import Entry, Format, ImageCache, Verify
from .dockerfile import DOCKERFILE, built_image_name, plan_context
from .oci import ImageError
from .registries import qualified, search_registries

# What a download that could not reach the network prints (curl, wget, pip, apt, git, uv)
NETWORK_ERRORS = re.compile(
    r"Could not resolve host|Temporary failure (?:in name resolution|resolving)|Name or service not known"
    r"|Network is unreachable|Failed to connect to|Failed to establish a new connection"
    r"|unable to resolve host address|Could not resolve hostname|dns error", re.IGNORECASE)
NETWORK_FAILURE_FIX = ("The step exited 0 (a pipeline's status is its last command's), so the image would lack "
                       "what it downloads: build on a node with network access, or through a mirror that serves it.")
_STEP = re.compile(r"^STEP (\d+)/(\d+): (.*)$")


class BuildahOptions(BaseModel):
    """How buildah runs here: where a site's registries are configured and where it keeps images."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    registries_conf: Path | None = None          # containers-registries.conf(5): mirrors, insecure registries
    storage_root: Path | None = None             # buildah --root (default: buildah's own, per user)
    storage_driver: Literal["vfs", "overlay"] | None = None   # vfs works on any filesystem, NFS too
    isolation: Literal["chroot", "oci", "rootless"] = "chroot"

    @field_validator("registries_conf")
    @classmethod
    def _exists(cls, v: Path | None) -> Path | None:
        if v is not None and not v.is_file():
            raise ValueError(f"{v} is not a file: give the path of a registries.conf (containers-registries.conf(5))")
        return v

    def global_args(self) -> list[str]:
        args = []
        if self.storage_root is not None:
            args += ["--root", str(self.storage_root), "--runroot", str(self.storage_root / "run")]
        if self.storage_driver is not None:
            args += ["--storage-driver", self.storage_driver]
        return args

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.registries_conf is not None:
            env["CONTAINERS_REGISTRIES_CONF"] = str(self.registries_conf.resolve())
        return env


def bud_command(opts: BuildahOptions, context: Path, tag: str) -> list[str]:
    return ["buildah", *opts.global_args(), "bud", "--isolation", opts.isolation, "-f", str(context / DOCKERFILE),
            "-t", tag, str(context)]


def push_command(opts: BuildahOptions, tag: str, archive: Path) -> list[str]:
    return ["buildah", *opts.global_args(), "push", tag, f"oci-archive:{archive}"]


def buildah_step(line: str) -> str | None:
    """The step a line of a buildah log announces (`STEP n/m: INSTRUCTION`), as messages name it; else None."""
    m = _STEP.match(line)
    return f"step {m.group(1)}/{m.group(2)} ({m.group(3)})" if m else None


def network_failures(log: str, step_of: Callable[[str], str | None] = buildah_step) -> list[tuple[str, str]]:
    """(the step, the line) for each step of a build log that could not reach the network; `step_of`
    reads the builder's step announcements."""
    step = "before the first step"
    out: list[tuple[str, str]] = []
    for line in log.splitlines():
        announced = step_of(line)
        if announced:
            step = announced
        elif NETWORK_ERRORS.search(line) and (not out or out[-1][0] != step):
            out.append((step, line.strip()))
    return out


def failed_step(log: str, step_of: Callable[[str], str | None] = buildah_step) -> str | None:
    """The step a failed build was at: the last one its log announces."""
    steps = [s for s in map(step_of, log.splitlines()) if s]
    return steps[-1] if steps else None


def _bases_from_layouts(context: Path, cache: ImageCache, opts: BuildahOptions, out) -> None:
    """Each FROM that was pulled into the cache (hpc/images/bases.py), into buildah's storage under the name
    the Dockerfile resolves it to, so that the build never goes to the registry for it."""
    conf = opts.registries_conf.read_text() if opts.registries_conf is not None else None
    for base in plan_context(context).bases:
        layout = pulled_base(cache, base)
        if layout is None:
            continue
        r = subprocess.run(["buildah", *opts.global_args(), "pull", "--quiet", f"oci:{layout}"], capture_output=True,
                           text=True, env=opts.env(), stdin=subprocess.DEVNULL)
        out.write(r.stderr)
        image_id = r.stdout.split()[-1] if r.returncode == 0 and r.stdout.split() else None
        name = qualified(base, search_registries(conf))
        tagged = image_id is not None and subprocess.run(
            ["buildah", *opts.global_args(), "tag", image_id, name], stdout=out, stderr=subprocess.STDOUT,
            env=opts.env()).returncode == 0
        if not tagged:
            raise ImageError(f"taking the base {base} from {layout} into buildah's storage failed: {r.stderr.strip()}")
        print(f"FROM {base}: from {layout}", file=out, flush=True)


def build_environment(context: Path, key: str, cache: ImageCache, fmt: Format = "rootfs",
                      opts: BuildahOptions | None = None, fakeroot: bool = False,
                      what: str | None = None, verify: Verify | None = None) -> tuple[Entry, bool]:
    """The cache entry of the image built from `context` (a directory with a Dockerfile), whose build
    key is `key`; True if this call built it. A failure raises ImageError naming `what` is built (default:
    the Dockerfile), the step and the log."""
    opts = opts or BuildahOptions()
    what = what or str(context / DOCKERFILE)
    label = built_image_name(key)
    found = cache.find(label, fmt)
    if found is not None:
        return found, False
    require_tool("buildah", f"building {what}")
    hexkey = key.partition(":")[2]
    tag = f"localhost/agentrl-build:{hexkey}"
    log = cache.root / "logs" / f"{hexkey}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    archive = cache.root / ".pulls" / f"{hexkey}-{os.getpid()}-{os.urandom(4).hex()}.tar"
    archive.parent.mkdir(parents=True, exist_ok=True)
    try:
        with log.open("w") as out:
            _bases_from_layouts(context, cache, opts, out)
            code = subprocess.run(bud_command(opts, context, tag), stdout=out, stderr=subprocess.STDOUT,
                                  env=opts.env(), stdin=subprocess.DEVNULL).returncode
        text = log.read_text(errors="replace")
        offline = network_failures(text)
        if code != 0:
            where = failed_step(text) or "before the first step"
            hint = f"; it could not reach the network ({offline[-1][1]})" if offline else ""
            raise ImageError(f"building {what} failed at {where} (exit {code}){hint}: see {log}")
        if offline:
            steps = "; ".join(f"{step}: {line}" for step, line in offline)
            raise ImageError(f"building {what}: {steps}. {NETWORK_FAILURE_FIX} Log: {log}")
        with log.open("a") as out:
            code = subprocess.run(push_command(opts, tag, archive), stdout=out, stderr=subprocess.STDOUT,
                                  env=opts.env(), stdin=subprocess.DEVNULL).returncode
        if code != 0:
            raise ImageError(f"exporting the image of {what} (buildah push) failed "
                             f"(exit {code}): see {log}")
        return build_image(archive, cache, fmt, fakeroot=fakeroot, label=label, verify=verify)
    finally:
        archive.unlink(missing_ok=True)
        if shutil.which("buildah"):     # the archive is in the cache now; buildah keeps the base layers
            subprocess.run(["buildah", *opts.global_args(), "rmi", tag], capture_output=True, env=opts.env())
