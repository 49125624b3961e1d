"""`agentrl tasks generate mutations`: bugs put into a real project, kept when its own tests catch them.

Unit: each operator's rewrite, the verdicts of every refusal reason from made-up runs, the traceback
cut to the tests' frames, the source layout refusals, the order and splits of candidates. Integration:
listkit (tests/data/mutations, a small project with a unittest suite) validated in bwrap sandboxes:
each refusal reason from a real run, the set generated twice from an sdist byte for byte, a re-run
that validates nothing, and the tasks through `convert harbor`, `tasks check` and its hacks.
"""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import libcst
import pytest
from ci import under_ci

from agentrl.cli import main
from agentrl.swe import generate as gen
from agentrl.swe.families.base import Draft
from agentrl.swe.mutate import build, issue, runner
from agentrl.swe.mutate.operators import OPERATORS, Mutator, Site
from agentrl.swe.mutate.project import (
    SRC_PATH,
    Project,
    SourceError,
    check_layout,
    from_directory,
    from_sdist,
    load,
    task_repository,
)
from agentrl.swe.mutate.verdict import Baseline, Run, Verdict, baseline, dedupe, failure_excerpts, judge

ROOT = Path(__file__).resolve().parents[1]
LISTKIT = ROOT / "tests/data/mutations/listkit"
CACHETOOLS = ROOT / "tests/data/mutations/cachetools-5.5.0.tar.gz"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                 reason="needs bubblewrap (make sysdeps) and root for overlay mounts")


def rewrites(source: str) -> dict[str, list[tuple[str, str]]]:
    m = Mutator(source)
    out: dict[str, list[tuple[str, str]]] = {}
    for s in m.sites:
        out.setdefault(s.operator, []).append((s.before, s.after))
    return out


# --- operators, pure --------------------------------------------------------------------------------------------

SOURCE = '''\
def find(items, x, lo=0, strict=True, sep=", "):
    if lo < 0:
        raise ValueError("lo")
    for i in range(len(items)):
        if items[i] == x and strict:
            return i + lo
    return pair(items[1:], x)
'''


def test_each_operator_rewrites_what_it_names_and_keeps_the_rest_of_the_file():
    r = rewrites(SOURCE)
    assert set(r) == set(OPERATORS)
    assert ("< 0", "<= 0") in r["comparison"] and ("== x", "!= x") in r["comparison"]
    assert {("0", "1"), ("1", "2"), ("len(items)", "len(items) - 1")} <= set(r["off-by-one"])
    assert ("lo < 0", "not (lo < 0)") in r["negated-condition"]
    assert {("i + lo", "i - lo"), ("items[i] == x and strict", "items[i] == x or strict")} <= set(r["swapped-operator"])
    assert r["removed-branch"] == [('if lo < 0:\n    raise ValueError("lo")', "")]
    assert r["swapped-arguments"] == [("pair(items[1:], x)", "pair(x, items[1:])")]
    assert set(r["changed-default"]) == {("0", "1"), ("True", "False"), ('", "', '""')}
    m = Mutator(SOURCE)
    for site in m.sites:
        mutated = m.mutate(site.index)
        compile(mutated, "<mutant>", "exec")
        changed = [(a, b) for a, b in zip(SOURCE.splitlines(), mutated.splitlines(), strict=False) if a != b]
        assert mutated != SOURCE and (len(changed) == 1 or site.operator == "removed-branch"), site
        assert site.function == "find"


def test_sites_are_the_same_for_the_same_source_and_refuse_what_python_cannot_parse():
    assert Mutator(SOURCE).sites == Mutator(SOURCE).sites
    with pytest.raises(libcst.ParserSyntaxError):
        Mutator("def f(:\n")
    # the only statement of a block is never removed (the block would be empty), nor are isinstance's arguments
    assert "removed-branch" not in rewrites("def f(x):\n    if x:\n        return 1\n")
    assert "swapped-arguments" not in rewrites("isinstance(a, int)\n")


# --- verdicts, pure ---------------------------------------------------------------------------------------------

BASE = Baseline(frozenset({"t.a", "t.b", "t.c", "t.d"}), frozenset({"t.f"}), frozenset({"t.x"}))


def run(fail=(), complete=True, timed_out=False, extra=None) -> Run:
    status = {t: ("FAIL" if t in fail else "ok") for t in ("t.a", "t.b", "t.c", "t.d", "t.f")}
    return Run({**status, "t.x": "ERROR", **(extra or {})}, complete, timed_out)


def test_each_refusal_reason_and_a_kept_mutant_from_its_runs():
    assert judge(BASE, run(["t.a"])) == Verdict(None, ("t.a",), ("t.b", "t.c", "t.d"))
    assert judge(BASE, run(["t.a"], timed_out=True, complete=False)).reason == "timeout"
    assert judge(BASE, run(["t.a"], complete=False)).reason == "breaks-suite"
    broken = judge(BASE, run(["t.a"], extra={"unittest.loader._FailedTest.test_m": "ERROR"}))
    assert (broken.reason, broken.detail) == ("breaks-suite", "unittest.loader._FailedTest.test_m failed to import")
    assert judge(BASE, run(["t.a", "t.b"])).kept and judge(BASE, run(["t.a", "t.b", "t.c"])).reason == "breaks-suite"
    assert judge(BASE, run(["t.f"])).reason == "flaky"
    assert judge(BASE, run(["t.a"]), confirm=run(["t.a", "t.b"])).reason == "flaky"
    assert judge(BASE, run()).reason == "equivalent" and judge(BASE, run(["t.x"])).reason == "equivalent"
    # a flaky test and one that never passed are named in neither list
    kept = judge(BASE, run(["t.a", "t.f"]), confirm=run(["t.a"]))
    assert kept.fail_to_pass == ("t.a",) and "t.f" not in kept.pass_to_pass and "t.x" not in kept.pass_to_pass


def test_clean_runs_make_passing_flaky_and_failing_tests():
    runs = [Run({"a": "ok", "f": "ok", "x": "FAIL"}, True), Run({"a": "ok", "f": "FAIL", "x": "FAIL"}, True)]
    assert baseline(runs) == Baseline(frozenset({"a"}), frozenset({"f"}), frozenset({"x"}))


def test_duplicates_same_diff_or_same_failing_set_in_the_same_function():
    kept = Verdict(None, ("t.a",), ("t.b",))
    other = Verdict(None, ("t.b",), ("t.a",))
    got = dedupe([(kept, b"d1", "m.py:f"), (kept, b"d1", "m.py:g"), (kept, b"d2", "m.py:f"),
                  (kept, b"d3", "m.py:g"), (other, b"d4", "m.py:f"), (Verdict("equivalent"), b"", "m.py:f")])
    assert [v.reason for v in got] == [None, "duplicate", "duplicate", None, None, "equivalent"]


LOG = '''\
test_a (tests.test_m.C.test_a) ... FAIL

======================================================================
FAIL: test_a (tests.test_m.C.test_a)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/tests/test_m.py", line 12, in test_a
    self.assertEqual(f(1), g(2))
  File "/testbed/pkg/m.py", line 3, in f
    return x + 2
           ^^^^^
AssertionError: <Thing at 0x7f3a2b1c9d00> != 2

Stdout:
printed

----------------------------------------------------------------------
Ran 1 test in 0.001s

FAILED (failures=1)
'''


def test_the_issue_shows_the_tests_frames_never_the_buggy_code_unless_hints_ask():
    said = failure_excerpts(LOG)
    assert said == {"tests.test_m.C.test_a": 'Traceback (most recent call last):\n'
                                             '  File "/testbed/tests/test_m.py", line 12, in test_a\n'
                                             '    self.assertEqual(f(1), g(2))\n'
                                             'AssertionError: <Thing at 0x...> != 2'}
    text = issue.instruction("pkg", ("tests.test_m.C.test_a",), said)
    assert "pkg/m.py" not in text and "x + 2" not in text and "printed" not in text
    assert "`tests.test_m.C.test_a`" in text and "AssertionError" in text
    hinted = issue.instruction("pkg", ("tests.test_m.C.test_a",), said, "The bug is in `pkg/m.py`, in `f`.")
    assert "`pkg/m.py`, in `f`" in hinted



def test_a_fix_hint_is_one_sed_that_undoes_the_bug_whatever_characters_the_line_holds(tmp_path):
    """Every candidate of listkit the one-line check passes, as the hinted order keeps them in the plain order;
    and lines full of sed's and the shell's syntax, each fix run by the real sed."""
    project = load(str(LISTKIT))
    plain, hinted = build.Mutants(project, "train", 0), build.Mutants(project, "train", 0, "fix")
    keys = [c.key for c in hinted.order]
    assert keys == [c.key for c in plain.order if c.key in set(keys)] and 0 < len(keys) < len(plain.order)
    cases = [(c.path, hinted.mutated(c), project.files[c.path].decode(), c.site) for c in hinted.order]
    for line, bad, good in (("x = a[i] * 2 if b else 'q'", "a[i] * 2", "a[i+1] * 2"),
                            ("s = re.sub(r'\\d+/', \"&\", t)", "r'\\d+/'", "r'\\d*/'"),
                            ("y = '$^.*[x]'", "'$^.*[x]'", "\"it's\"")):
        site = Site(0, "made-up", 2, "f", good, bad)
        cases.append(("pkg/m.py", f"a\n{line}\nb\n", f"a\n{line.replace(bad, good)}\nb\n", site))
    for path, mutated, original, site in cases:
        assert issue.fixable(path, original.encode(), site)
        hint = issue.fix_hint(path, mutated, original, site)
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(mutated)
        subprocess.run(["sh", "-c", hint.sed()], cwd=tmp_path, check=True)
        assert (tmp_path / path).read_text() == original, hint.sed()
        assert f"`{hint.sed()}` makes the fix" in hint.text() and f"line {hint.line} of `{path}`" in hint.text()
    # what a hint cannot say: a backquote ends its code span, and the bug's text must be once on its line
    for line, before, after in (("x = '`a`' + b", "'`a`'", "'a'"), ("y = b + b", "b", "c"), ("z = 1", "2", "3")):
        assert not issue.fixable("pkg/m.py", f"{line}\n".encode(), Site(0, "made-up", 1, "f", before, after))
    with pytest.raises(gen.GenerationError, match="report this"):
        issue.fix_hint("pkg/m.py", "y = c\nq\n", "y = b\nr\n", Site(0, "made-up", 1, "f", "b", "c"))


# --- sources, pure ----------------------------------------------------------------------------------------------

def sdist(root: Path, top: str, extra: dict[str, bytes] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        files = {**from_directory(root).files, **(extra or {})}
        for rel, data in files.items():
            info = tarfile.TarInfo(f"{top}/{rel}" if not rel.startswith("/") else rel)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_source_is_read_the_same_from_a_checkout_and_its_sdist(tmp_path):
    checkout = from_directory(LISTKIT)
    (tmp_path / "listkit-1.0.tar.gz").write_bytes(sdist(LISTKIT, "listkit-1.0"))
    packed = from_sdist(tmp_path / "listkit-1.0.tar.gz")
    assert packed.files == checkout.files and packed.name == "listkit-1.0"
    assert "listkit/search.py" in checkout.mutable() and not [p for p in checkout.mutable() if p.startswith("tests/")]
    (tmp_path / "evil.tar.gz").write_bytes(sdist(LISTKIT, "x-1", {"/etc/x": b""}))
    with pytest.raises(SourceError, match="leaves the archive"):
        from_sdist(tmp_path / "evil.tar.gz")


@pytest.mark.integration
def test_a_requirement_comes_from_find_links_alone_on_a_node_without_network(tmp_path):
    """--find-links DIR: pip takes the requirement's sdist from DIR and nowhere else (--no-index)."""
    links = tmp_path / "links"
    links.mkdir()
    setup = b"from setuptools import setup\nsetup(name='listkit', version='1.0', packages=['listkit'])\n"
    (links / "listkit-1.0.tar.gz").write_bytes(sdist(LISTKIT, "listkit-1.0", {"setup.py": setup}))
    project = load("listkit==1.0", find_links=links)
    assert project.name == "listkit-1.0" and project.files == {**from_directory(LISTKIT).files, "setup.py": setup}
    # an sdist the index has (docs/tasks.md's example) is not fetched: DIR is all pip looks in
    with pytest.raises(SourceError, match=r"more-itertools==10\.5\.0: pip download found no sdist"):
        load("more-itertools==10.5.0", find_links=links)


@pytest.mark.integration
def test_a_requirement_comes_from_the_index_whatever_its_build_backend():
    """docs/tasks.md's example: more-itertools builds with flit_core, which this environment lacks; pip reads
    its metadata in an isolated build environment of its own. (The index is reachable under CI.)"""
    from agentrl.swe.mutate.project import from_requirement

    try:
        project = from_requirement("more-itertools==10.5.0")
    except SourceError as e:
        if "Could not fetch URL" in str(e) or "Failed to establish" in str(e):   # no network here
            if under_ci():
                raise
            pytest.skip(f"the package index is not reachable: {e}")
        raise
    assert project.name == "more-itertools-10.5.0"
    assert "more_itertools/more.py" in project.mutable() and any(p.startswith("tests/test_") for p in project.files)


def test_a_source_the_grader_cannot_run_is_refused_naming_the_file_and_the_fix():
    good = from_directory(LISTKIT)
    check_layout(good, "listkit")
    no_tests = type(good)("p", {k: v for k, v in good.files.items() if not k.startswith("tests/")})
    with pytest.raises(SourceError, match=r"no tests found \(directories named tests or test"):
        check_layout(no_tests, "p")
    src = type(good)("p", {**{"src/" + k if k.startswith("listkit/") else k: v for k, v in good.files.items()},
                           "tests/__init__.py": b"def broken(:\n"})
    with pytest.raises(SourceError, match=r"tests/__init__.py does not parse.*src/ layout"):
        check_layout(src, "p")
    only_tests = type(good)("p", {k: v for k, v in good.files.items() if k.startswith("tests/")})
    with pytest.raises(SourceError, match=r"no Python module outside the tests \(tests\)"):
        check_layout(only_tests, "p")


def test_a_src_layouts_tests_import_it_from_src_and_the_tests_tree_goes_whole_to_the_verifier():
    """tests/__init__.py gets SRC_PATH after its docstring and __future__ imports (which must stay first);
    helpers and data under tests/ are the verifier's too, as suite/, for test.sh to put in place."""
    files = {"src/pkg/__init__.py": b"X = 1\n", "pyproject.toml": b"",
             "tests/__init__.py": b'"""Helpers."""\nfrom __future__ import annotations\n\nHELP = 2\n',
             "tests/data/table.txt": b"1 2\n", "tests/sub/__init__.py": b"", "tests/sub/test_deep.py": b"",
             "tests/test_pkg.py": b"import unittest\n"}
    project = Project("pkg", files)
    check_layout(project, "pkg")
    repo = task_repository(project)
    init = repo["tests/__init__.py"]
    assert init == b'"""Helpers."""\nfrom __future__ import annotations\n' + SRC_PATH + b"\nHELP = 2\n"
    assert task_repository(Project("pkg", {**files, "tests/__init__.py": b""}))["tests/__init__.py"] == SRC_PATH
    flat = Project("pkg", {k.removeprefix("src/"): v for k, v in files.items()})
    assert task_repository(flat) == flat.files                      # a flat layout's tree as it is
    namespace: dict = {"__file__": "/testbed/tests/__init__.py"}
    exec(compile(init, "tests/__init__.py", "exec"), namespace)
    assert namespace["_sys"].path[0] == "/testbed/src" and namespace["HELP"] == 2
    namespace["_sys"].path.remove("/testbed/src")

    draft = Draft(key="k", instruction="fix it\n", repo=repo, fixed={"src/pkg/__init__.py": b"X = 1\n"},
                  hidden={}, fail_to_pass=("tests.test_pkg.T.test_x",), pass_to_pass=(), description="d",
                  metadata={})
    task = gen.layout("t", draft, "mutations", "train", 0, b"#!/bin/sh\n", suite=project.tests)
    assert {rel.removeprefix("tests/suite/") for rel in task if rel.startswith("tests/suite/")} == {
        rel.removeprefix("tests/") for rel in repo if rel.startswith("tests/")}
    assert task["tests/suite/__init__.py"] == init
    assert not any(rel.startswith("tests/test_") for rel in task)     # nothing test.sh's old path would copy


def test_modules_a_tool_wrote_are_not_mutated():
    """Parser tables (pycparser's yacctab.py: thousands of numbers), Unicode data (idna's), version files."""
    code = b"def f(x):\n    return x < 1\n"
    files = {"pkg/core.py": code, "tests/test_core.py": b"",
             "pkg/yacctab.py": b"\n# yacctab.py\n# This file is automatically generated. Do not edit.\n" + code,
             "pkg/lextab.py": b"# lextab.py. This file automatically created by PLY (version 3.10).\n" + code,
             "pkg/version.py": b"# file generated by setuptools_scm\n" + code,
             "pkg/later.py": b"\n\n\n# automatically generated below the third line: still mutated\n" + code}
    assert Project("p", files).mutable() == ["pkg/core.py", "pkg/later.py"]


def test_candidates_are_ordered_by_the_seed_and_the_splits_share_none():
    project = load(str(LISTKIT))
    train, heldout = build.Mutants(project, "train", 0), build.Mutants(project, "heldout", 0)
    keys = [c.key for c in train.order]
    assert keys == [c.key for c in build.Mutants(project, "train", 0).order]
    assert keys != [c.key for c in build.Mutants(project, "train", 1).order]
    assert sorted(keys) == sorted(c.key for c in build.Mutants(project, "train", 1).order)
    assert not set(keys) & {c.key for c in heldout.order} and len(keys) + len(heldout.order) > 60
    assert {c.site.operator for c in train.order + heldout.order} == set(OPERATORS)


def test_arguments_are_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["tasks", "generate", "mutations", "--n", "1", "--split", "train", "--out", str(out)]) == 2
    assert "--source" in capsys.readouterr().err
    for bad, said in ((["--clean-runs", "1"], "--clean-runs"), (["--split", "test"], "heldout"),
                      (["--slurm", "--parallelism", "0"], "--parallelism must be at least 1"),
                      (["--sbatch-option=--partition=cpu"], "--sbatch-option is for --slurm")):
        args = ["--n", "1", "--split", "train", *bad]
        assert main(["tasks", "generate", "mutations", "--source", str(LISTKIT), "--out", str(out), *args]) == 2
        assert said in capsys.readouterr().err
    assert main(["tasks", "generate", "pyfix", "--source", "x", "--n", "1", "--split", "train",
                 "--out", str(out)]) == 2
    assert "mutations and commits families'" in capsys.readouterr().err and not out.exists()


# --- validation in sandboxes ------------------------------------------------------------------------------------

def validate(project, picks, tmp_path, timeout_s=2.0):
    """The verdicts of the candidates `picks` names ((path, function, operator, before)), run for real."""
    tmp_path.mkdir()
    cands = {(c.path, c.site.function, c.site.operator, c.site.before): (m, c)
             for split in gen.SPLITS for m in [build.Mutants(project, split, 0)] for c in m.order}
    spec = runner.suite_spec("t", timeout_s, build.RESOURCES)
    repo = {**build.task_repository(project)}
    jobs = [runner.Job(tmp_path / "clean.json", b"", 3)]
    jobs += [runner.Job(tmp_path / f"{i}.json", cands[p][0].diff(cands[p][1]), 2) for i, p in enumerate(picks)]
    runner.run_jobs(repo, spec, jobs, workers=2, timeout_s=timeout_s)
    base = baseline(runner.read_result(tmp_path / "clean.json"))
    rows = []
    for i, p in enumerate(picks):
        first, again = runner.read_result(tmp_path / f"{i}.json")
        rows.append((judge(base, first, again), cands[p][0].diff(cands[p][1]), f"{p[0]}:{p[1]}"))
    return base, dedupe(rows)


@pytest.mark.integration
@needs_bwrap
def test_every_refusal_reason_from_real_runs_of_the_projects_suite(tmp_path):
    project = load(str(LISTKIT))
    # a test that passes, then fails, then passes: the clean runs share a sandbox, and /tmp with it
    toggle = (b"import os\nimport unittest\n\nfrom listkit.chunks import page_count\n\n\n"
              b"class ToggleTest(unittest.TestCase):\n    def test_toggle(self):\n"
              b"        self.assertEqual(page_count(list(range(25))), 3)\n"
              b"        if os.path.exists('/tmp/toggle'):\n            os.remove('/tmp/toggle')\n"
              b"            self.fail('every other run')\n        open('/tmp/toggle', 'w').close()\n")
    flaky = type(project)("listkit", {**project.files, "tests/test_toggle.py": toggle})
    base, verdicts = validate(flaky, [("listkit/chunks.py", "page_count", "swapped-operator",
                                       "(len(items) + per_page - 1) // per_page")], tmp_path / "flaky")
    assert base.flaky == {"tests.test_toggle.ToggleTest.test_toggle"} and len(base.passing) == 22
    assert [v.reason for v in verdicts] == ["flaky"]          # only the flaky test sees the bug
    picks = [("listkit/search.py", "bisect_left", "swapped-operator", "mid + 1"),          # an endless loop
             ("listkit/_check.py", "positive", "negated-condition", "value < 1"),          # every helper raises
             ("listkit/chunks.py", "page_count", "changed-default", "10"),                 # no test calls it
             ("listkit/chunks.py", "chunk", "swapped-operator", "i + size"),
             ("listkit/chunks.py", "chunk", "off-by-one", "size")]                         # the same failing tests
    base, verdicts = validate(project, picks, tmp_path / "plain")
    assert not base.flaky and len(base.passing) == 22
    assert [v.reason for v in verdicts] == ["timeout", "breaks-suite", "equivalent", None, "duplicate"]
    assert verdicts[3].fail_to_pass == ("tests.test_chunks.ChunkTest.test_even",
                                        "tests.test_chunks.ChunkTest.test_short_last")


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".mutations" not in p.parts}


@pytest.mark.slow
@pytest.mark.integration
@needs_bwrap
def test_generated_from_an_sdist_byte_for_byte_resumable_and_through_check_and_hacks(tmp_path, monkeypatch):
    """A real project's sdist, vendored: cachetools 5.5.0 (MIT), a src/ layout whose tests/__init__.py holds
    the helper every test module uses, graded through the shared test.sh with its tests/ tree whole."""
    args = ["tasks", "generate", "mutations", "--source", str(CACHETOOLS), "--n", "2",
            "--split", "heldout", "--seed", "4", "--test-timeout", "5"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b"), "--jobs", "1"]) == 0
    a = tree(tmp_path / "a")
    assert a == tree(tmp_path / "b") and sorted({p.split("/")[0] for p in a}) == [
        f"mutations-heldout-s4-{i:04d}" for i in range(2)]
    first = tmp_path / "a/mutations-heldout-s4-0000"
    toml = (first / "task.toml").read_text()
    path = toml.split('path = "')[1].split('"')[0]
    assert path not in (first / "instruction.md").read_text() and 'project = "cachetools-5.5.0"' in toml
    assert path.startswith("src/cachetools/")
    assert (first / "tests/test.sh").read_bytes() == gen.verifier_files()["test.sh"]
    assert (first / "tests/suite/__init__.py").read_bytes().startswith(SRC_PATH)
    assert b"class CacheTestMixin" in (first / "environment/repo/tests/__init__.py").read_bytes()

    # a re-run validates nothing; one result lost is the one validated again
    ran = []
    real = runner.run_jobs
    monkeypatch.setattr(build, "run_jobs",
                        lambda repo, spec, todo, **kw: (ran.extend(todo), real(repo, spec, todo, **kw)))
    assert main([*args, "--out", str(tmp_path / "a")]) == 0 and ran == []
    first_tried = build.Mutants(load(str(CACHETOOLS)), "heldout", 4).order[0]     # its verdict is needed
    [lost] = (tmp_path / "a/.mutations").glob(f"*/{first_tried.id}.json")
    lost.unlink()
    assert main([*args, "--out", str(tmp_path / "a")]) == 0 and [j.path for j in ran] == [lost]
    assert tree(tmp_path / "a") == a

    jsonl = tmp_path / "prompts.jsonl"
    assert main(["convert", "harbor", str(tmp_path / "a"), "--out", str(jsonl)]) == 0
    assert len(jsonl.read_text().splitlines()) == 2
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "check", str(tmp_path / "a"), "--leaks",
                        "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert [(t["oracle_reward"], t["noop_reward"], t["problem"]) for t in result["tasks"]] == [(1.0, 0.0, "")] * 2
    # No answer the generator left within reach. A host task's sandbox sees the host's /usr, though, and a host
    # with cachetools installed somewhere (this one's cloud SDK vendors it) hands the agent the unmutated module:
    # the audit names those places, each a file of the host's own.
    assert [t["problem"] for t in result["leaks"]] == ["", ""]
    leaks = [leak for t in result["leaks"] for leak in t["leaks"]]
    assert [leak for leak in leaks if not (leak["place"].startswith("/usr/") and Path(leak["place"]).is_file())] == []
    # The hacks that act on what this family brings (the project's modules and its tests), graded with the patch
    # in a fresh sandbox; the rest attack the grader, the same bytes in every family (tests/test_task_generate.py
    # runs them all), and the whole default set costs 20 s more (docs/tasks.md: it passes).
    chosen = ["exit0-at-import", "tests-forced-pass", "tests-deleted", "tests-uncollected", "stale-bytecode"]
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "check", str(first), "--hacks-only",
                        "--grading", "isolated", "--json", *(f"--hack={h}" for h in chosen)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    hacks = json.loads(r.stdout.strip().splitlines()[-1])["hacks"]
    assert r.returncode == 0 and sorted(h["hack"] for h in hacks) == sorted(chosen)
    assert [h for h in hacks if h["reward"] != 0.0 or h["problem"]] == []
