"""Tasks from a repository's own history (`agentrl tasks generate commits --source CHECKOUT`), as R2E-Gym and
SWE-rebench make them: a commit that changes both the code and its tests is a candidate bug fix.

For a commit C with one parent P, its changed files split into tests (C's test directories, suite.py, and
any test module) and the rest. The candidate's project is C's tree: its clean runs are C's tests on C's
code. Its "bug" is the commit's change to the code undone (its Python modules outside the tests, docs,
setup.py and examples, as a mutant's: a patch from C back to P on those files), so the task's repository is
P's code with C's tests and C's other files (docs, data, packaging), and the solution is the commit's own
change to the code.
The same verdicts as a mutant's decide it (verdict.judge): FAIL_TO_PASS are the tests that pass at C and
fail on P's code, PASS_TO_PASS pass both ways; refused when the undone change breaks the suite (a test
module that imports what P lacks), when no passing test fails, when only flaky ones do, or as a duplicate.
A commit is no candidate when it is a merge or the root, changes no Python code or no test, or changes a
binary file (the patch carries text). The instruction is the commit's message and the failing tests, never
the diff. The task's repository is written without .git: no commit after P is within the agent's reach.

History is read with git's plumbing only (rev-list, ls-tree, cat-file: no hook, filter or fsmonitor of the
checkout runs), first parents from HEAD back.
"""

from __future__ import annotations

import difflib
import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .project import MAX_PROJECT_BYTES, NOT_MUTATED, Project, SourceError, _skipped
from .suite import looks_like_test

SKIPS = ("merge", "root", "no-test-change", "no-code-change", "binary", "too-large")


@dataclass(frozen=True)
class Commit:
    """One commit as a candidate sees it: C's tree, and P's version of each file C changes (None: C added it)."""
    sha: str
    parent: str
    message: str
    files: dict[str, bytes]
    before: dict[str, bytes | None]


@dataclass(frozen=True)
class CommitCandidate:
    key: str
    commit: Commit
    project: Project                  # C's tree, named PROJECT@SHORT
    code: tuple[str, ...]             # the code C changed (Project.mutable's kind of file): the fix
    tests: tuple[str, ...]            # the test files C changed

    @property
    def id(self) -> str:
        return hashlib.sha256(self.key.encode()).hexdigest()[:20]

    @property
    def place(self) -> str:
        """Where the bug is, for duplicates: the commit."""
        return self.commit.sha

    def undo(self) -> bytes:
        """The patch from C back to P on the code files (the bug): `git apply` takes it, additions and
        deletions included."""
        return b"".join(file_patch(rel, self.commit.files.get(rel), self.commit.before[rel]) for rel in self.code)

    def fix(self) -> bytes:
        """The commit's own change to the code: the solution."""
        return b"".join(file_patch(rel, self.commit.before[rel], self.commit.files.get(rel)) for rel in self.code)


def file_patch(rel: str, old: bytes | None, new: bytes | None) -> bytes:
    """A unified diff of one text file for `git apply`; None is the file's absence."""
    a, b = (x.decode().splitlines(keepends=True) if x is not None else [] for x in (old, new))
    for lines in (a, b):
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n\\ No newline at end of file\n"
    head = f"diff --git a/{rel} b/{rel}\n"
    if old is None:
        head += "new file mode 100644\n"
    elif new is None:
        head += "deleted file mode 100644\n"
    body = "".join(difflib.unified_diff(a, b, "/dev/null" if old is None else f"a/{rel}",
                                        "/dev/null" if new is None else f"b/{rel}", n=3))
    return (head + body).encode() if body else b""


def candidate(name: str, commit: Commit) -> CommitCandidate | str:
    """The commit as a candidate, or the reason it is none (one of SKIPS)."""
    changed = sorted(commit.before)
    project = Project(f"{name}@{commit.sha[:10]}", commit.files)
    layout = project.tests
    tests = tuple(rel for rel in changed if layout.holds(rel) or looks_like_test(rel))
    # The fix is the code a bug can live in, as a mutant's (not docs, setup.py or examples): the tests cannot
    # ask for a changelog line or a version bump, and a solution holding such generic lines is found "leaked"
    # wherever they lie (`tasks check --leaks`)
    code = tuple(rel for rel in changed if rel not in tests and rel.endswith(".py") and not NOT_MUTATED.match(rel))
    if not code:
        return "no-code-change"
    if not tests:
        return "no-test-change"
    for rel in code:
        for data in (commit.files.get(rel), commit.before[rel]):
            try:
                if data is not None:
                    data.decode()
            except UnicodeDecodeError:
                return "binary"
    key = f'{{"commit": "{commit.sha}", "project": "{name}"}}'
    return CommitCandidate(key, commit, project, code, tests)


class Git:
    """A checkout's history through git's plumbing; SourceError naming the checkout when git cannot read it."""

    def __init__(self, checkout: Path) -> None:
        self.checkout = checkout
        self._blobs: dict[str, bytes] = {}
        top = self._run("rev-parse", "--show-toplevel").decode().strip()
        if Path(top).resolve() != checkout.resolve():
            raise SourceError(f"--source {checkout}: not the top of a git checkout (that is {top}): name it")

    def _run(self, *args: str, input: bytes | None = None) -> bytes:
        r = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(self.checkout), *args], input=input,
                           capture_output=True, timeout=600)
        if r.returncode != 0:
            raise SourceError(f"--source {self.checkout}: `git {' '.join(args)}` failed: "
                              f"{r.stderr.decode(errors='replace').strip()[-400:]} (commits needs a git checkout "
                              "with its history: not a shallow clone)")
        return r.stdout

    def first_parents(self, limit: int) -> list[tuple[str, list[str]]]:
        """(sha, parents) from HEAD back along first parents, at most `limit`."""
        out = self._run("rev-list", "--first-parent", "--parents", f"--max-count={limit}", "HEAD").decode()
        return [(line.split()[0], line.split()[1:]) for line in out.splitlines() if line.strip()]

    def message(self, sha: str) -> str:
        return self._run("show", "-s", "--format=%B", sha).decode(errors="replace").strip()

    def tree(self, sha: str) -> dict[str, str]:
        """path -> blob sha of the commit's regular files (links and submodules left out)."""
        out, files = self._run("ls-tree", "-r", "-z", sha), {}
        for entry in out.split(b"\0"):
            if not entry:
                continue
            meta, path = entry.split(b"\t", 1)
            mode, kind, blob = meta.decode().split()
            rel = path.decode(errors="surrogateescape")
            if kind == "blob" and mode in ("100644", "100755") and not _skipped(rel):
                files[rel] = blob
        return files

    def blobs(self, shas: list[str]) -> dict[str, bytes]:
        """Each blob's bytes (cached: successive commits share most of theirs)."""
        todo = sorted(set(shas) - set(self._blobs))
        if todo:
            out, at = self._run("cat-file", "--batch", input="".join(s + "\n" for s in todo).encode()), 0
            for sha in todo:
                header_end = out.index(b"\n", at)
                size = int(out[at:header_end].split()[2])
                self._blobs[sha] = out[header_end + 1:header_end + 1 + size]
                at = header_end + 1 + size + 1
        return {s: self._blobs[s] for s in shas}


def read_history(checkout: Path, name: str, limit: int = 1000) -> tuple[list[CommitCandidate], dict[str, int]]:
    """The candidates among the last `limit` first-parent commits of the checkout (oldest first), and how many
    commits were skipped for each reason."""
    git = Git(checkout)
    found, skipped = [], dict.fromkeys(SKIPS, 0)
    for sha, parents in reversed(git.first_parents(limit)):
        if len(parents) != 1:
            skipped["root" if not parents else "merge"] += 1
            continue
        now, then = git.tree(sha), git.tree(parents[0])
        changed = sorted(rel for rel in set(now) | set(then) if now.get(rel) != then.get(rel))
        files = git.blobs(list(now.values()))
        if sum(map(len, files.values())) > MAX_PROJECT_BYTES:
            skipped["too-large"] += 1
            continue
        before_blobs = git.blobs([then[rel] for rel in changed if rel in then])
        commit = Commit(sha, parents[0], git.message(sha), {rel: files[b] for rel, b in sorted(now.items())},
                        {rel: before_blobs[then[rel]] if rel in then else None for rel in changed})
        c = candidate(name, commit)
        if isinstance(c, str):
            skipped[c] += 1
        else:
            found.append(c)
    return found, skipped
