"""What the test runs say about a mutant (pure): kept with its FAIL_TO_PASS and PASS_TO_PASS, or refused.

A run is the verbose unittest log the grader reads, parsed by the grader's own parser (so the names
here are the names expected.json must hold). The clean tree runs several times: a test that passed
every time is passing, one whose result changed is flaky and is named in neither list (a task
graded on it would reward luck). A mutant is refused, in this order, as
    timeout       its run did not finish (an endless loop): grading it would only time out
    breaks-suite  the run never reached its summary, a test module failed to import, or more than
                  BREAK_FRACTION of the passing tests fail: a crash, not a bug to find
    flaky         only flaky tests failed, or the confirming run failed a different set
    equivalent    no passing test fails: nothing tells the bug from the fix
    duplicate     an earlier kept mutant has the same diff, or the same failing set from the same
                  function: the same task twice
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from .suite import looks_like_test

REASONS = ("timeout", "breaks-suite", "flaky", "equivalent", "duplicate")
BREAK_FRACTION = 0.5
COLLECTION = ("unittest.loader._FailedTest.", "unittest.loader.ModuleImportFailure.")
_BLOCK = re.compile(r"^(?:FAIL|ERROR|UNEXPECTED SUCCESS): (\S+) \(([A-Za-z_][\w.]*)\)")
_FRAME = re.compile(r'^  File "([^"]+)", line \d+, in ')
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")
_CAPTURED = re.compile(r"^-+ Captured (?:stdout|stderr|log) ")
_PYTEST_SECTION = re.compile(r"^=+ (.+?) =+$")       # pytest's "==== FAILURES ====", and its summary's
_PYTEST_TEST = re.compile(r"^_{3,} (.+?) _{3,}$")


@dataclass(frozen=True)
class Run:
    status: dict[str, str]          # test id -> "ok", "FAIL", "ERROR", "skipped", ...
    complete: bool                  # reached unittest's summary
    timed_out: bool = False
    failures: dict[str, str] = field(default_factory=dict)   # test id -> what it said (failure_excerpts)

    def to_json(self) -> dict:
        return {"status": dict(sorted(self.status.items())), "complete": self.complete,
                "timed_out": self.timed_out, "failures": dict(sorted(self.failures.items()))}

    @classmethod
    def from_json(cls, data: dict) -> Run:
        return cls(dict(data["status"]), bool(data["complete"]), bool(data["timed_out"]), dict(data["failures"]))


@dataclass(frozen=True)
class Baseline:
    passing: frozenset[str]
    flaky: frozenset[str]
    failing: frozenset[str]         # never passed on the clean tree: named nowhere


@dataclass(frozen=True)
class Verdict:
    reason: str | None              # None: kept
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    detail: str = ""

    @property
    def kept(self) -> bool:
        return self.reason is None


def failure_excerpts(log: str, runner: str = "unittest") -> dict[str, str]:
    """Each failed test's traceback as a user would paste it into an issue: the frames in the test files
    and the exception, never a frame of the code under test (which would say where the bug is). Memory
    addresses are masked, so the excerpt is the same on every run."""
    from ..generate import shipped_grader

    if runner == "pytest":
        return _pytest_excerpts(log, shipped_grader()["parse_pytest"](log)[0])
    test_id = shipped_grader()["test_id"]
    out: dict[str, str] = {}
    blocks = re.split(r"^={20,}$", log, flags=re.M)[1:]
    for block in blocks:
        head, _, body = block.strip("\n").partition("\n")
        m = _BLOCK.match(head)
        if not m:
            continue
        body = re.split(r"^-{20,}$", body, flags=re.M)[1] if re.search(r"^-{20,}$", body, flags=re.M) else body
        out.setdefault(test_id(m.group(1), m.group(2)), _cut(body.splitlines()))
    return out


def _cut(lines: list[str]) -> str:
    """A traceback's lines without the frames outside the test files; up to captured output."""
    kept, in_frame, keep = [], False, False
    for line in lines:
        if line.startswith(("Stdout:", "Stderr:")) or _CAPTURED.match(line):
            break
        frame = _FRAME.match(line)
        if frame:
            in_frame, keep = True, looks_like_test(frame.group(1))
        elif not (in_frame and line.startswith("    ")):
            in_frame, keep = False, True
        if keep:
            kept.append(line)
    return _ADDRESS.sub("0x...", "\n".join(kept).strip("\n"))


def _pytest_excerpts(log: str, status: dict[str, str]) -> dict[str, str]:
    """pytest --tb=native's FAILURES and ERRORS sections, each under a `____ name ____` line that names the
    test as its node id's tail does (TestC.test_m for tests/test_x.py::TestC::test_m)."""
    failed = [t for t, s in status.items() if s != "ok"]
    out: dict[str, str] = {}
    section: bool | None = None
    name: str | None = None
    body: list[str] = []

    def flush() -> None:
        if section and name is not None:
            tail = name.removeprefix("ERROR at setup of ").removeprefix("ERROR at teardown of ")
            for t in failed:
                if t.split("::", 1)[-1].replace("::", ".") == tail:
                    out.setdefault(t, _cut(body))
                    break
    for line in log.splitlines():
        head = _PYTEST_SECTION.match(line)
        test = _PYTEST_TEST.match(line)
        if head or test:
            flush()
            name, body = (test.group(1) if test else None), []
            if head:
                section = head.group(1) in ("FAILURES", "ERRORS")
        else:
            body.append(line)
    flush()
    return out


def baseline(runs: list[Run]) -> Baseline:
    """The clean tree's repeated runs, as passing, flaky and failing tests."""
    names = set().union(*(r.status for r in runs))
    ok = {t: [r.status.get(t) == "ok" for r in runs] for t in names}
    return Baseline(frozenset(t for t, v in ok.items() if all(v)),
                    frozenset(t for t, v in ok.items() if any(v) and not all(v)),
                    frozenset(t for t, v in ok.items() if not any(v)))


def judge(base: Baseline, run: Run, confirm: Run | None = None) -> Verdict:
    """The verdict on one mutant from its run (and, when it would be kept, its confirming run)."""
    if run.timed_out:
        return Verdict("timeout", detail="the test run did not finish in time")
    broken = sorted(t for t, s in run.status.items() if t.startswith(COLLECTION) and s != "ok")
    failing = sorted(t for t in base.passing if run.status.get(t) != "ok")
    if not run.complete or broken or len(failing) > BREAK_FRACTION * len(base.passing):
        why = (f"{broken[0]} failed to import" if broken else "the run never reached its summary"
               if not run.complete else f"{len(failing)} of {len(base.passing)} passing tests fail")
        return Verdict("breaks-suite", detail=why)
    if not failing:
        flaky = sorted(t for t in base.flaky if run.status.get(t) != "ok")
        return Verdict("flaky", detail=f"only flaky {flaky[0]} failed") if flaky else \
            Verdict("equivalent", detail="no passing test fails")
    if confirm is not None:
        again = sorted(t for t in base.passing if confirm.status.get(t) != "ok")
        if confirm.timed_out or again != failing:
            return Verdict("flaky", detail=f"the failing tests changed between two runs: {failing} then {again}")
    return Verdict(None, tuple(failing), tuple(sorted(base.passing - set(failing))))


def dedupe(verdicts: list[tuple[Verdict, bytes, str]]) -> list[Verdict]:
    """Verdicts in candidate order, a kept one refused as a duplicate of an earlier kept one with the same
    diff, or the same failing set from the same place (`site`: the file and function)."""
    seen: set = set()
    out = []
    for v, diff, site in verdicts:
        keys = {("diff", diff), ("tests", site, v.fail_to_pass)}
        if v.kept and keys & seen:
            v = Verdict("duplicate", detail="an earlier task has the same diff or the same failing tests here")
        elif v.kept:
            seen |= keys
        out.append(v)
    return out


def unified_diff(path: str, old: str, new: str) -> bytes:
    """The change as `git apply` takes it (both texts end in a newline: Project.mutable sees to that)."""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 f"a/{path}", f"b/{path}", n=3)
    return "".join(lines).encode()
