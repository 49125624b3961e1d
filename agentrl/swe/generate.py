"""Harbor tasks made procedurally (`agentrl tasks generate FAMILY`).

A family (agentrl/swe/families/) turns a `random.Random` into a Draft: a buggy repository,
the fixed files, hidden tests and which of them fail before the fix. Here each draft becomes
a Harbor task directory graded as the bundled tasks are (tests/test.sh and tests/grade.py are
the same bytes, from one source: agentrl/swe/verifier/), its tests are run on the host
against the buggy repository and against the one its solve.sh leaves, and it is written.

Task i of (family, split, seed) is drawn from random.Random("family/split/seed/i"), and
drawn again from that stream while its key (what the task is: template, bug, constants; not
the names it got) belongs to the other split or repeats an earlier task of the set. A key's
split is a bit of its SHA-256, so train and heldout never hold the same task, whatever the
seeds. The same (family, split, seed, n) gives the same bytes, and a larger n extends a
smaller one. Each task is built in a temp directory beside its place and renamed there.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib.resources
import json
import os
import random
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hpc.fsio import fsync_dir, fsync_tree, temp_path

from .families import FAMILIES, Draft, GenerationError
from .mutate.suite import TestLayout

SPLITS = ("train", "heldout")
# What a mutations task's instruction may tell of its bug (--hints): agentrl/swe/mutate/issue.py
HINTS = ("location", "fix")
MAX_DRAWS = 1000              # redraws for one task before its family is declared too small
VERIFIER = ("test.sh", "grade.py")
EOF_MARK = "AGENTRL_EOF"
REPO = "environment/repo/"
HOST_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"   # a host sandbox's python3


class Refused(ValueError):
    """Arguments or an output directory the generator will not work with; the message says what to change."""


def verifier_files() -> dict[str, bytes]:
    """The grader every task ships, byte for byte: package data, so an installed wheel has it too."""
    root = importlib.resources.files("agentrl.swe") / "verifier"
    return {name: (root / name).read_bytes() for name in VERIFIER}


@functools.cache
def shipped_grader() -> dict:
    """grade.py's functions (its log parser), from the very bytes the tasks ship."""
    namespace: dict = {"__name__": "agentrl_task_grade"}
    exec(compile(verifier_files()["grade.py"], "grade.py", "exec"), namespace)
    return namespace


def suite_command(python: str, runner: str = "unittest", tests: TestLayout | None = None) -> list[str]:
    """The suite's command line, as the grader runs it (grade.py's runner_command): unittest's, or pytest's,
    over tests/ or the layout's test directories."""
    dirs = list(tests.dirs) if tests is not None and not tests.default else None
    return [python, *shipped_grader()["runner_command"](runner, dirs)]


def split_of(key: str) -> str:
    return SPLITS[hashlib.sha256(key.encode()).digest()[0] & 1]


def task_name(family: str, split: str, seed: int, index: int) -> str:
    """Unique across sets: two seeds' sets merge into one prompt file without clashing instance ids."""
    return f"{family}-{split}-s{seed}-{index:04d}"


def check_arguments(family: str, split: str, n: int) -> None:
    if family not in FAMILIES:
        raise Refused(f"unknown task family {family!r}: choose one of {', '.join(sorted(FAMILIES))}")
    if split not in SPLITS:
        raise Refused(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise Refused(f"--n must be a whole number of tasks, at least 1; got {n!r}")


def drafts(family: str, split: str, seed: int, n: int) -> list[tuple[str, Draft]]:
    """(name, draft) of tasks 0..n-1: pure, the same every time."""
    check_arguments(family, split, n)
    draw, seen, out = FAMILIES[family], set(), []
    for i in range(n):
        name, rng = task_name(family, split, seed, i), random.Random(f"{family}/{split}/{seed}/{i}")
        for _ in range(MAX_DRAWS):
            try:
                d = draw(rng)
            except GenerationError as e:
                raise GenerationError(f"{name}: {e}") from None
            if split_of(d.key) == split and d.key not in seen:
                break
        else:
            raise GenerationError(f"{name}: {MAX_DRAWS} draws found no new {split} task: family {family!r} has too "
                                  f"few distinct tasks for --n {n}")
        seen.add(d.key)
        out.append((name, d))
    return out


def _toml(s: str) -> str:
    return json.dumps(s)   # a JSON string of this text is a TOML basic string


def task_toml(name: str, draft: Draft, family: str, split: str, seed: int, built: bool = False) -> str:
    """The task's task.toml: a host task, or with `built` one whose image environment/Dockerfile builds and
    whose repository is environment/repo/ beside it ([environment] testbed)."""
    meta = {"difficulty": "easy", "category": "bugfix", "language": "python", "family": family, "split": split,
            **draft.metadata}
    lines = ['schema_version = "1.1"', "", "[task]", f"name = {_toml('agentrl/' + name)}",
             f"description = {_toml(draft.description)}", "", "[metadata]",
             *(f"{k} = {_toml(v)}" for k, v in meta.items()), f"seed = {int(seed)}", "",
             "[agent]", "timeout_sec = 300.0", "", "[verifier]", "timeout_sec = 60.0", "", "[environment]",
             *(['# The image is built from environment/Dockerfile; testbed and workdir are agentrl keys: the',
                '# repository, environment/repo/, is put at workdir (one image serves every bug of a project).',
                'testbed = "repo"'] if built else
               ['# "host": the host\'s own root filesystem (agentrl convention); workdir is an agentrl key.',
                'docker_image = "host"']),
             'workdir = "/testbed"', "cpus = 1", "memory_mb = 512"]
    return "\n".join(lines) + "\n"


def solve_sh(fixed: dict[str, bytes]) -> bytes:
    """A solution that writes each fixed file whole, from a heredoc: no network, no tools beyond bash."""
    parts = ["#!/usr/bin/env bash", "# Reference solution: writes the fixed file(s) whole.", "set -euo pipefail",
             "TESTBED=${TESTBED:-/testbed}"]
    for rel, data in sorted(fixed.items()):
        text = data.decode()
        if not text.endswith("\n") or EOF_MARK in text.splitlines():
            raise GenerationError(f"{rel}: a heredoc cannot carry it (it must end in a newline, no {EOF_MARK} line)")
        parts.append(f"cat > \"$TESTBED\"/{shlex.quote(rel)} <<'{EOF_MARK}'\n{text}{EOF_MARK}")
    return ("\n".join(parts) + "\n").encode()


def layout(name: str, draft: Draft, family: str, split: str, seed: int,
           solve: bytes | None = None, suite: TestLayout | None = None,
           environment: dict[str, bytes] | None = None, runner: str = "unittest") -> dict[str, bytes]:
    """Every file of the task directory, relative path -> bytes, laid out as the bundled tasks are; `solve`
    replaces the solve.sh that writes the fixed files whole (the mutations family's is a patch). With
    `suite`, the verifier carries the repository's whole test directories as tests/suite/ (grade.py's place
    puts them in place of the repository's), not only its tests/test_*.py: a real project's tests have
    helpers and data. tests/ alone goes as suite/ itself; other layouts at their own paths below suite/, with
    the conftest.py files above them, and expected.json names them (test_dirs). `environment` is a build
    context for environment/ (a Dockerfile among it): the task's image. `runner` is how the grader runs the
    suite (grade.py's RUNNERS): expected.json names it when it is not unittest."""
    if suite is not None and suite.default:
        repo_tests = {"suite/" + rel.split("/", 1)[1]: data for rel, data in draft.repo.items()
                      if rel.startswith("tests/")}
    elif suite is not None:
        repo_tests = {"suite/" + rel: data for rel, data in draft.repo.items() if suite.holds(rel)}
    else:
        repo_tests = {rel.split("/", 1)[1]: data for rel, data in draft.repo.items()
                      if rel.startswith("tests/test_") and rel.count("/") == 1}
    clash = sorted((set(repo_tests) | {*VERIFIER, "expected.json"}) & set(draft.hidden))
    if clash or not draft.fail_to_pass:
        raise GenerationError(f"{name}: " + (f"hidden test files {clash} clash with the verifier's" if clash
                                             else "FAIL_TO_PASS names no test"))
    expected = {"FAIL_TO_PASS": sorted(draft.fail_to_pass), "PASS_TO_PASS": sorted(draft.pass_to_pass),
                **({"runner": runner} if runner != "unittest" else {}),
                **({"test_dirs": list(suite.dirs)} if suite is not None and not suite.default else {})}
    files = {"instruction.md": draft.instruction.encode(),
             "task.toml": task_toml(name, draft, family, split, seed, built=environment is not None).encode(),
             **{f"environment/{rel}": data for rel, data in (environment or {}).items()},
             "solution/solve.sh": solve if solve is not None else solve_sh(draft.fixed),
             **{REPO + rel: data for rel, data in draft.repo.items()},
             **{f"tests/{n}": data for n, data in verifier_files().items()},
             "tests/expected.json": (json.dumps(expected, indent=2) + "\n").encode(),
             **{f"tests/{n}": data for n, data in {**repo_tests, **draft.hidden}.items()}}
    return dict(sorted(files.items()))


def _write_files(root: Path, files: dict[str, bytes]) -> None:
    """Files and their modes exactly (scripts 755, the rest 644, directories 755), whatever the umask."""
    for rel, data in files.items():
        path = root / rel
        for d in reversed(path.relative_to(root).parents):
            if not (root / d).is_dir():
                (root / d).mkdir()
                (root / d).chmod(0o755)
        mode = 0o755 if rel.endswith(".sh") else 0o644
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        path.chmod(mode)


def _run_tests(repo: Path, python: str) -> tuple[dict[str, str], bool, str]:
    r = subprocess.run(suite_command(python), cwd=repo, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(repo), "LC_ALL": "C.UTF-8"})
    status, complete = shipped_grader()["parse"](r.stdout + r.stderr)
    return status, complete, (r.stdout + r.stderr)[-1500:]


def check_on_host(name: str, files: dict[str, bytes], draft: Draft, python: str = HOST_PYTHON) -> None:
    """Run the task's tests as its grader would (its tests/ in place of the repository's), before and
    after its solve.sh: FAIL_TO_PASS must fail, then pass; PASS_TO_PASS pass both times; nothing else
    may run. Raises GenerationError naming the task otherwise."""
    named = set(draft.fail_to_pass) | set(draft.pass_to_pass)
    with tempfile.TemporaryDirectory(prefix="agentrl-generate-") as tmp:
        repo = Path(tmp) / "repo"
        _write_files(repo, {rel[len(REPO):]: data for rel, data in files.items()
                            if rel.startswith(REPO) and not rel.startswith(REPO + "tests/")})
        _write_files(repo, {"tests/__init__.py": b"", **{rel: data for rel, data in files.items()
                                                          if rel.startswith("tests/test_") and rel.endswith(".py")}})
        _write_files(Path(tmp), {"solve.sh": files["solution/solve.sh"]})
        for stage in ("before", "after"):
            if stage == "after":
                r = subprocess.run(["bash", str(Path(tmp) / "solve.sh")], capture_output=True, text=True, timeout=60,
                                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TESTBED": str(repo)})
                if r.returncode != 0:
                    raise GenerationError(f"{name}: solution/solve.sh exited {r.returncode}: {r.stderr[-500:]}")
                for rel, data in draft.fixed.items():
                    if (repo / rel).read_bytes() != data:
                        raise GenerationError(f"{name}: solution/solve.sh does not leave {rel} as the fix has it")
            status, complete, log = _run_tests(repo, python)
            bad = [f"{t}: {status.get(t, 'missing')}" for t in sorted(named)
                   if (status.get(t) == "ok") != (stage == "after" or t in draft.pass_to_pass)]
            extra = sorted(set(status) - named)
            if bad or extra or not complete:
                why = "; ".join(bad + [f"{t} runs but expected.json does not name it" for t in extra] +
                                ([] if complete else ["the run never reached its summary"]))
                raise GenerationError(f"{name}: {stage} the fix, the tests do not come out as designed ({why}); "
                                      f"the task is not written. Log:\n{log}")


def occupied(path: Path) -> bool:
    """Anything but nothing or an empty directory."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        return True
    return path.is_dir() and any(path.iterdir())


def write_task(out: Path, name: str, files: dict[str, bytes], force: bool = False) -> Path:
    """DIR/name whole or not at all: built beside it, fsynced, renamed into place. With `force` an
    occupied place is first renamed aside (between the two renames the task is briefly absent)."""
    target, tmp = out / name, temp_path(out / name)
    try:
        tmp.mkdir()
        tmp.chmod(0o755)
        _write_files(tmp, files)
        fsync_tree(tmp)
        if force and occupied(target):
            aside = temp_path(target)
            os.rename(target, aside)
            os.rename(tmp, target)
            if aside.is_dir() and not aside.is_symlink():
                shutil.rmtree(aside)
            else:
                aside.unlink()
        else:
            try:
                os.rename(tmp, target)        # onto nothing, or an empty directory
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                    raise
                raise Refused(f"{target} appeared meanwhile and is not empty: pass --force to replace it") from e
        fsync_dir(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def generate(family: str, split: str, seed: int, n: int, out: Path, *, force: bool = False, jobs: int = 2,
             python: str = HOST_PYTHON, progress: Callable[[str], None] | None = None) -> list[Path]:
    """Draw, lay out and check every task, then write them; nothing is written unless all pass."""
    check_arguments(family, split, n)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise Refused(f"--out {out} is not a directory: name a directory (it is created if missing)")
    names = [task_name(family, split, seed, i) for i in range(n)]
    taken = [] if force else [p for p in (out / name for name in names) if occupied(p)]
    if taken:
        more = f" (and {len(taken) - 1} more)" if len(taken) > 1 else ""
        raise Refused(f"{taken[0]} exists and is not empty{more}: pass --force to replace, or choose another --out")
    step = max(10, n // 10)      # progress every 10%, and never for a handful
    tasks = [(name, draft, layout(name, draft, family, split, seed)) for name, draft in drafts(family, split, seed, n)]
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for done, _ in enumerate(pool.map(lambda t: check_on_host(t[0], t[2], t[1], python), tasks), 1):
            if progress and done % step == 0:
                progress(f"{family} {split}: {done}/{n} tasks checked on the host")
    out.mkdir(parents=True, exist_ok=True)
    return [write_task(out, name, files, force) for name, _, files in tasks]
