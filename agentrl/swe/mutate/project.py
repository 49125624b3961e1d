"""A source project, read once into memory: a local checkout, an sdist, or a requirement pip fetches.

What a task can carry is fixed by the grader every task shares (agentrl/swe/verifier/test.sh): it
replaces tests/ with an empty __init__.py and the task's tests/test_*.py, then runs
`python3 -I -B -m unittest discover -s tests -t .` in the repository, on the host's Python with no
install step. So a source qualifies when its tests are unittest-runnable modules tests/test_*.py that
import the package from the repository's root; `check_layout` refuses the others, naming the file and
what to change. The files are kept as bytes, in sorted order, so a project read twice is the same.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..families.base import GenerationError

# Never part of a task's repository: build and tool output, caches, VCS metadata.
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".tox", ".nox", ".venv", "venv", ".mypy_cache",
                          ".pytest_cache", ".ruff_cache", "build", "dist", ".eggs", "node_modules"})
# Not mutated: packaging and docs, whose bugs no test sees.
NOT_MUTATED = re.compile(r"^(setup\.py|conftest\.py|noxfile\.py|docs?/.*|examples?/.*|benchmarks?/.*|tests/.*)$")
MAX_PROJECT_BYTES = 32 * 2**20


class SourceError(GenerationError):
    """A source that cannot be read or cannot make tasks; the message names it and the fix."""


@dataclass(frozen=True)
class Project:
    name: str                      # for task names and keys: the directory's or sdist's name
    files: dict[str, bytes]        # repository path -> bytes, sorted

    @property
    def digest(self) -> str:
        """What the project is, byte for byte: a changed source gets new candidates and new result files."""
        h = hashlib.sha256()
        for rel, data in self.files.items():
            h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()[:16]

    def mutable(self) -> list[str]:
        """The modules whose bugs a task can hold: Python files outside tests, docs and packaging."""
        return [rel for rel in self.files if rel.endswith(".py") and not NOT_MUTATED.match(rel)
                and self.files[rel].endswith(b"\n")]   # difflib's hunks need the last line ended


def _skipped(rel: str) -> bool:
    parts = PurePosixPath(rel).parts
    return any(p in SKIPPED_DIRS or p.endswith(".egg-info") for p in parts[:-1]) or rel.endswith((".pyc", ".pyo"))


def from_directory(root: Path) -> Project:
    """A checkout's files (symlinks and special files left out: a task carries regular files)."""
    files, total = {}, 0
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink() or not path.is_file() or _skipped(rel):
            continue
        data = path.read_bytes()
        total += len(data)
        if total > MAX_PROJECT_BYTES:
            raise SourceError(f"{root}: more than {MAX_PROJECT_BYTES >> 20} MiB of files: point --source at a "
                              "smaller project, or at a checkout without data files")
        files[rel] = data
    return Project(root.resolve().name, dict(sorted(files.items())))


def from_sdist(path: Path) -> Project:
    """An sdist's files, its top directory (NAME-VERSION/) stripped; links and absolute paths refused."""
    files, top = {}, set()
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar.getmembers():
                parts = PurePosixPath(member.name).parts
                if member.name.startswith("/") or ".." in parts:
                    raise SourceError(f"{path}: member {member.name!r} leaves the archive: not an sdist to trust")
                if not member.isfile() or len(parts) < 2:
                    continue
                top.add(parts[0])
                rel = "/".join(parts[1:])
                if _skipped(rel):
                    continue
                f = tar.extractfile(member)
                files[rel] = f.read() if f is not None else b""
    except (tarfile.TarError, OSError, EOFError) as e:
        raise SourceError(f"{path}: not a readable .tar.gz sdist ({e})") from None
    if len(top) != 1:
        raise SourceError(f"{path}: an sdist holds one top directory (NAME-VERSION/), this one {sorted(top)}")
    return Project(top.pop(), dict(sorted(files.items())))


def from_requirement(requirement: str, find_links: Path | None = None) -> Project:
    """The sdist of `requirement` (`more-itertools==10.5.0`) as pip downloads it; with `find_links`, from
    that directory alone (offline).

    pip reads an sdist's metadata to match it, with its build backend: from the index in an isolated build
    environment, or offline from this environment (setuptools is here; another backend must be installed)."""
    index = ["--no-index", "--find-links", str(find_links), "--no-build-isolation"] if find_links else []
    with tempfile.TemporaryDirectory(prefix="agentrl-sdist-") as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                            "--quiet", "--dest", tmp, *index, requirement],
                           capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        got = sorted(Path(tmp).glob("*.tar.gz"))
        if r.returncode != 0 or len(got) != 1:
            said = (r.stderr or r.stdout).strip()[-800:] or f"{len(got)} sdists"
            backend = (" (with --find-links, the sdist's build backend must be installed where this runs: "
                       "pip install it)" if find_links and "backend" in said else "")
            raise SourceError(f"--source {requirement}: pip download found no sdist ({said}): name a "
                              f"requirement with an sdist on the index, or pass its .tar.gz or a checkout{backend}")
        return from_sdist(got[0])


def load(spec: str, find_links: Path | None = None) -> Project:
    """A `--source`: a directory, a .tar.gz, or else a requirement for pip."""
    path = Path(spec)
    if path.is_dir():
        project = from_directory(path)
    elif spec.endswith(".tar.gz"):
        if not path.is_file():
            raise SourceError(f"--source {spec}: no such file")
        project = from_sdist(path)
    else:
        project = from_requirement(spec, find_links)
    check_layout(project, spec)
    return project


def check_layout(project: Project, spec: str) -> None:
    """Refuse what the shared grader cannot run, naming the file and the change that makes it fit."""
    tests = [rel for rel in project.files if rel.startswith("tests/")]
    modules = [rel for rel in tests if re.fullmatch(r"tests/test_[^/]*\.py", rel)]
    if not modules:
        raise SourceError(f"--source {spec}: no tests/test_*.py: the grader runs unittest modules of that name "
                          "directly under tests/ (a test/ directory or tests elsewhere: move them there)")
    others = [rel for rel in tests if rel not in modules and rel != "tests/__init__.py"
              and not rel.endswith(".pyc")]
    if others:
        raise SourceError(f"--source {spec}: {others[0]}{f' and {len(others) - 1} more' if len(others) > 1 else ''}"
                          ": the grader keeps only tests/test_*.py (test.sh replaces tests/ with them), so the "
                          "tests would lose it: fold helpers into the test modules or the package, data into the "
                          "tests as literals")
    if not project.mutable():
        raise SourceError(f"--source {spec}: no Python module outside tests/, docs/ and setup.py to put a bug in")


def task_repository(project: Project) -> dict[str, bytes]:
    """The repository as a task holds it: tests/__init__.py empty, as the grader makes it."""
    return {**{rel: data for rel, data in project.files.items()}, "tests/__init__.py": b""}
