"""What a source's tests need beyond the standard library: its requirements as wheels, in an image of its own.

A source given `--with REQ` (`--source attrs==23.1.0 --with pytest --with hypothesis`) has its
requirements fetched once as wheels (`pip download --only-binary :all:`; with --find-links from that
directory alone, offline). Its tasks then carry an environment/ build context, the same for every task
of the source:

    environment/Dockerfile     FROM the base, the wheels installed with pip --no-index, WORKDIR /testbed
    environment/wheels/*.whl   the wheels, so the build needs no index
    environment/repo/          the task's repository: [environment] testbed, carried beside the image

so `agentrl images build` makes one image per source, whose tasks differ only in their repositories.
Validation runs in that same image, found in --image-cache by the name its tasks will give
(`dockerfile:<key>`); until it is there the command says how to build it (`environments.jsonl`).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hpc.fsio import write_atomic
from hpc.images.cache import ImageCache
from hpc.images.dockerfile import DOCKERFILE, build_key, built_image_name
from hpc.sandbox.base import SandboxError

from ..sandboxes import resolve_image
from ..task import encode_payload
from .project import Project, SourceError

DEFAULT_BASE = "python:3.11-slim"
IMAGE_BUILDS = "environments.jsonl"   # under OUT/.mutations: the builds `agentrl images build` is to make
WHEELS = "wheels"
MAX_WHEEL_BYTES = 48 * 2**20         # a task carries its wheels: a dependency bigger than that belongs in a base image
REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*([<>=!~]=?.*)?$")


@dataclass(frozen=True)
class RequirementsImage:
    requirements: tuple[str, ...]
    base: str
    wheels: dict[str, bytes]          # file name -> bytes, sorted
    # Distributions the requirements install that hold the project's own modules (the project itself, from
    # its wheel, as a dependency of a test tool or named by --with): removed again after the install, for
    # their files are the unmutated code, the answer to every task of the source (`tasks check --leaks`).
    # The tests import the project from the work tree, as they do without it.
    uninstall: tuple[str, ...] = ()

    @property
    def runner(self) -> str:
        """pytest runs the suite when it is one of the requirements (it runs unittest's tests too)."""
        names = {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in self.requirements}
        return "pytest" if "pytest" in names else "unittest"

    def dockerfile(self) -> str:
        reqs = " ".join(_quote(r) for r in self.requirements)
        # PIP_BREAK_SYSTEM_PACKAGES: a base whose Python a distribution manages (PEP 668) refuses a plain
        # install; older pips ignore the variable. pip gets no index: the wheels are all there is.
        return (f"FROM {self.base}\n"
                f"COPY {WHEELS}/ /tmp/agentrl-wheels/\n"
                "RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index --no-cache-dir "
                f"--disable-pip-version-check --find-links /tmp/agentrl-wheels {reqs} && rm -rf /tmp/agentrl-wheels"
                + ("".join(f" && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip uninstall -y --disable-pip-version-check "
                           f"{_quote(name)}" for name in self.uninstall))
                + "\nWORKDIR /testbed\n")

    def context(self) -> dict[str, bytes]:
        """The build context, as a task's environment/ holds it (its testbed aside)."""
        return {DOCKERFILE: self.dockerfile().encode(), **{f"{WHEELS}/{n}": d for n, d in self.wheels.items()}}

    @property
    def key(self) -> str:
        return build_key(self.context())

    @property
    def image(self) -> str:
        """The image's name in the cache: what `agentrl convert harbor` names it from a task's environment/."""
        return built_image_name(self.key)

    def record(self, project: Project) -> dict:
        """A prompt record that `agentrl images build` builds this environment from (environments.jsonl)."""
        return {"prompt": f"the environment of {project.name}'s mutations tasks",
                "metadata": {"instance_id": f"environment-{project.name}", "image": self.image,
                             "harbor": {"environment_build": {
                                 "key": self.key, "executable": [], "check": None,
                                 "files": {rel: encode_payload(data) for rel, data in self.context().items()}}}}}


def _quote(requirement: str) -> str:
    return "'" + requirement.replace("'", "") + "'"


def check_requirement(requirement: str) -> str:
    """A `--with` value: a requirement pip understands, without URLs, paths or options (what a Dockerfile's
    RUN line and a task carry must be plain)."""
    r = requirement.strip()
    if not REQUIREMENT.match(r) or "'" in r or r.startswith("-"):
        raise SourceError(f"--with {requirement!r}: not a requirement such as 'pytest' or 'hypothesis==6.100.*' "
                          "(URLs, paths and pip options are refused: put a wheel in a --find-links directory)")
    return r


def top_level_names(files) -> set[str]:
    """The import names a set of paths provides at the top: a package's directory or a module's stem (a src/
    layout's src/ and a wheel's .dist-info and .data left out)."""
    names = set()
    for rel in files:
        parts = PurePosixPath(rel).parts
        if parts and parts[0] == "src" and len(parts) > 1:
            parts = parts[1:]
        if not parts or parts[0].endswith((".dist-info", ".data")):
            continue
        if len(parts) > 1 or parts[0].endswith(".py"):
            names.add(parts[0].removesuffix(".py"))
    return names


def shadowing(wheels: dict[str, bytes], project: Project) -> tuple[str, ...]:
    """The distributions among `wheels` that install one of the project's own top-level modules."""
    own = top_level_names(project.mutable())
    found = []
    for name, data in wheels.items():
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            if top_level_names(z.namelist()) & own:
                found.append(name.split("-", 1)[0])
    return tuple(sorted(found))


def fetch(requirements: tuple[str, ...], base: str, find_links: Path | None = None,
          project: Project | None = None) -> RequirementsImage:
    """The requirements' wheels, their dependencies included, as pip downloads them for this Python; those
    that install `project`'s own modules are uninstalled again in the image (RequirementsImage.uninstall)."""
    index = ["--no-index", "--find-links", str(find_links)] if find_links else []
    with tempfile.TemporaryDirectory(prefix="agentrl-wheels-") as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--only-binary", ":all:", "--quiet",
                            "--disable-pip-version-check", "--dest", tmp, *index, *requirements],
                           capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            said = (r.stderr or r.stdout).strip()[-800:]
            where = f"in --find-links {find_links}" if find_links else "on the index"
            raise SourceError(f"--with {' '.join(requirements)}: pip download found no wheels {where} ({said}): "
                              "name requirements that have wheels, or pip download them into a --find-links "
                              "directory where there is network")
        wheels = {}
        for p in sorted(Path(tmp).iterdir()):
            if p.suffix != ".whl":
                raise SourceError(f"--with: pip downloaded {p.name}, not a wheel: its tests' dependencies must "
                                  "install without a build (name a version that has a wheel)")
            wheels[p.name] = p.read_bytes()
    if sum(map(len, wheels.values())) > MAX_WHEEL_BYTES:
        raise SourceError(f"--with {' '.join(requirements)}: the wheels take more than {MAX_WHEEL_BYTES >> 20} MiB, "
                          "which every task would carry: put them in the base image (--base-image) instead")
    return RequirementsImage(requirements, base, wheels, shadowing(wheels, project) if project is not None else ())


def work_name(project: Project, environment: RequirementsImage | None) -> str:
    """The source's directory under OUT/.mutations: its results hold for this project in this environment."""
    if environment is None:
        return f"{project.name}-{project.digest}"
    digest = hashlib.sha256(json.dumps([project.digest, environment.key]).encode()).hexdigest()[:16]
    return f"{project.name}-{digest}"


def require_images(environments: list[tuple[Project, RequirementsImage]], cache_dir: Path | None, jsonl: Path) -> None:
    """Every source's image is in the cache before anything is validated; else `jsonl` holds the builds that
    are missing and the SourceError is the command that makes them."""
    cache = ImageCache(cache_dir) if cache_dir else None
    missing = []
    for project, environment in environments:
        try:
            resolve_image(environment.image, "bwrap", cache)
        except SandboxError:
            missing.append((project, environment))
    if not missing:
        return
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(jsonl, b"".join(json.dumps(e.record(p), sort_keys=True).encode() + b"\n" for p, e in missing))
    names = ", ".join(f"{p.name} (with {', '.join(e.requirements)})" for p, e in missing)
    raise SourceError(f"the image of {names} is not in --image-cache {cache_dir} yet: validation runs in the image "
                      f"the tasks will use. Build it with `agentrl images build {jsonl} --cache {cache_dir}` (and "
                      "--registries-conf, --slurm... as for any data set), then run this command again")
