"""Tasks from projects whose tests are not in tests/: the suite found as the project's runner finds it
(agentrl/swe/mutate/suite.py), carried at its own paths and put back by the grader (grade.py place),
validated and graded in real sandboxes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.swe import generate as gen
from agentrl.swe.mutate.project import SRC_PATH, Project, SourceError, check_layout, task_repository
from agentrl.swe.mutate.suite import find

ROOT = Path(__file__).resolve().parents[1]
LISTKIT = ROOT / "tests/data/mutations/listkit"
GRADE = ROOT / "agentrl/swe/verifier/grade.py"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                 reason="needs bubblewrap (make sysdeps) and root for overlay mounts")
T = b"import unittest\n"


def dirs(files: dict[str, bytes]) -> tuple[str, ...]:
    return find(files).dirs


def test_test_directories_wherever_they_are_topmost_and_none_beside_the_source():
    pkg = {"pkg/__init__.py": b"", "pkg/core.py": b"X = 1\n"}
    assert find({**pkg, "tests/test_a.py": T}).default
    assert dirs({**pkg, "test/test_a.py": T, "test/data/x.txt": b""}) == ("test",)
    assert dirs({**pkg, "pkg/tests/test_a.py": T, "pkg/tests/unit/test_b.py": T}) == ("pkg/tests",)
    assert dirs({**pkg, "pkg/a/tests/test_a.py": T, "pkg/b/tests/b_test.py": T, "pkg/b/tests/helpers.py": b"",
                 "pkg/c/tests/data.txt": b""}) == ("pkg/a/tests", "pkg/b/tests")      # c/tests holds no test
    assert dirs({**pkg, "tests/unit/tests/test_a.py": T}) == ("tests",)
    assert dirs({**pkg, "test/testlex.py": T}) == ("test",)        # unittest discover's test*.py, in a test dir
    beside = {**pkg, "pkg/test_core.py": T, "pkg/testing.py": b""}
    assert dirs(beside) == () and "directories named tests or test" in find(beside).found_by
    with pytest.raises(SourceError, match=r"no tests found \(directories named tests or test holding"):
        check_layout(Project("p", beside), "p")


def test_pytests_testpaths_choose_where_to_look_from_the_file_pytest_reads():
    files = {"pkg/__init__.py": b"", "pkg/core.py": b"X = 1\n", "testing/test_a.py": T, "testing/util.py": b"",
             "tests/test_old.py": T, "src/lib/__init__.py": b"", "src/lib/tests/test_l.py": T}
    toml = b'[tool.pytest.ini_options]\ntestpaths = ["testing", "src"]\n'
    layout = find({**files, "pyproject.toml": toml})
    assert layout.dirs == ("src/lib/tests", "testing") and "pyproject.toml (testing src)" in layout.found_by
    assert dirs({**files, "setup.cfg": b"[tool:pytest]\ntestpaths =\n    ./testing/\n"}) == ("testing",)
    assert dirs({**files, "tox.ini": b"[pytest]\ntestpaths = src/*/tests\n"}) == ("src/lib/tests",)   # a glob
    # pytest.ini is pytest's file even without testpaths: pyproject's are not read, every test dir counts
    assert dirs({**files, "pytest.ini": b"[pytest]\n", "pyproject.toml": toml}) == ("src/lib/tests", "tests")
    # a pyproject.toml without pytest's table, a setup.cfg without its section: not pytest's configuration
    assert dirs({**files, "pyproject.toml": b"[project]\nname = 'p'\n", "setup.cfg": b"[tool:pytest]\ntestpaths = "
                 b"testing\n"}) == ("testing",)
    assert dirs({**files, "pyproject.toml": b"not = [toml\n"}) == ("src/lib/tests", "tests")
    # python_files: the project's own module patterns, in place of test_*.py and *_test.py
    checks = {"pkg/__init__.py": b"", "pkg/core.py": b"X = 1\n", "checks/check_core.py": T, "spec/core_spec.py": T}
    layout = find({**checks, "pyproject.toml": b'[tool.pytest.ini_options]\ntestpaths = ["checks", "spec"]\n'
                   b'python_files = ["check_*.py"]\n'})
    assert layout.dirs == ("checks",) and "python_files in pyproject.toml (check_*.py)" in layout.found_by
    assert dirs({**checks, "tests/check_x.py": T, "setup.cfg": b"[tool:pytest]\npython_files = check_*.py\n"}) \
        == ("tests",)
    assert dirs({**checks, "tests/check_x.py": T}) == ()               # pytest's defaults would not collect it


def test_the_suite_is_never_mutated_and_each_test_directory_becomes_a_package():
    files = {"src/pkg/__init__.py": b"", "src/pkg/core.py": b"X = 1\n", "src/pkg/tests/test_a.py": T,
             "src/pkg/tests/helpers.py": b"H = 1\n", "src/pkg/conftest.py": b"", "test/test_b.py": T,
             "test/__init__.py": b'"""Doc."""\n'}
    project = Project("p", files)
    check_layout(project, "p")
    assert project.tests.dirs == ("src/pkg/tests", "test")
    assert project.mutable() == ["src/pkg/core.py"]     # not the helpers, not conftest.py
    assert project.tests.holds("src/pkg/conftest.py") and project.tests.holds("src/pkg/tests/helpers.py")
    assert not project.tests.holds("src/pkg/core.py") and not project.tests.holds("src/pkg/other/conftest.py")
    repo = task_repository(project)
    assert repo["src/pkg/tests/__init__.py"] == b""                   # imported as pkg.tests, from src/
    assert repo["test/__init__.py"] == b'"""Doc."""\n' + SRC_PATH     # a top-level one finds src/ as tests/ does
    broken = Project("p", {**files, "test/__init__.py": b"def (:\n"})
    with pytest.raises(SourceError, match=r"test/__init__.py does not parse"):
        check_layout(broken, "p")


def write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def grade(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", str(GRADE), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_place_puts_the_verifiers_copies_back_and_follows_no_link_the_agent_made(tmp_path):
    verifier, repo, outside = tmp_path / "tests", tmp_path / "repo", tmp_path / "outside"
    write(verifier, {"expected.json": json.dumps({"FAIL_TO_PASS": ["a"], "test_dirs": ["pkg/tests", "test"]}).encode(),
                     "suite/pkg/tests/__init__.py": b"", "suite/pkg/tests/test_a.py": b"REAL\n",
                     "suite/test/test_b.py": b"REAL\n", "suite/conftest.py": b"OURS\n"})
    write(outside, {"tests/test_a.py": b"KEEP\n"})
    write(repo, {"pkg/core.py": b"code\n", "test/test_b.py": b"EDITED\n", "test/extra_test.py": b"MINE\n",
                 "conftest.py": b"AGENT'S\n", "pkg/conftest.py": b"AGENT'S\n"})
    (repo / "pkg" / "tests").symlink_to(outside / "tests")        # the test directory a link out of the tree
    r = grade("place", str(verifier), cwd=repo)
    assert r.returncode == 0, r.stderr
    assert (outside / "tests/test_a.py").read_bytes() == b"KEEP\n"
    assert not (repo / "pkg/tests").is_symlink() and (repo / "pkg/tests/test_a.py").read_bytes() == b"REAL\n"
    assert sorted(p.name for p in (repo / "test").iterdir()) == ["test_b.py"]
    assert (repo / "test/test_b.py").read_bytes() == b"REAL\n"
    assert (repo / "conftest.py").read_bytes() == b"OURS\n" and not (repo / "pkg/conftest.py").exists()
    assert (repo / "pkg/core.py").read_bytes() == b"code\n"         # the agent's code stays

    # a directory on the way made a link: replaced by a real one, the place it pointed to untouched
    shutil.rmtree(repo / "pkg")
    (repo / "pkg").symlink_to(outside)
    assert grade("place", str(verifier), cwd=repo).returncode == 0
    assert not (repo / "pkg").is_symlink() and (repo / "pkg/tests/test_a.py").read_bytes() == b"REAL\n"
    assert (outside / "tests/test_a.py").read_bytes() == b"KEEP\n"

    # expected.json's test_dirs may not leave the tree
    write(verifier, {"expected.json": json.dumps({"FAIL_TO_PASS": ["a"], "test_dirs": ["../outside"]}).encode()})
    r = grade("place", str(verifier), cwd=repo)
    assert r.returncode == 2 and "not a relative path inside the repository" in r.stderr
    assert (outside / "tests/test_a.py").exists()


def test_place_keeps_the_tests_tree_layouts_of_before(tmp_path):
    """suite/ as the tests/ tree, and a task of test_*.py modules alone: what test.sh's cp did."""
    verifier, repo = tmp_path / "tests", tmp_path / "repo"
    write(verifier, {"expected.json": b'{"FAIL_TO_PASS": ["a"]}', "suite/__init__.py": b"H\n",
                     "suite/data/x.txt": b"1\n", "test_a.py": b"not this one\n"})
    write(repo, {"tests/test_mine.py": b"", "conftest.py": b"kept: tests/ needs no conftest from above\n"})
    assert grade("place", str(verifier), cwd=repo).returncode == 0
    assert sorted(p.relative_to(repo / "tests").as_posix() for p in (repo / "tests").rglob("*") if p.is_file()) == [
        "__init__.py", "data/x.txt"]
    assert (repo / "conftest.py").exists()
    shutil.rmtree(verifier / "suite")
    assert grade("place", str(verifier), cwd=repo).returncode == 0
    assert {p.name: p.read_bytes() for p in (repo / "tests").iterdir()} == {"__init__.py": b"",
                                                                          "test_a.py": b"not this one\n"}


PASS = b"import unittest\n\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n"
FAIL = b"import unittest\n\n\nclass T(unittest.TestCase):\n    def test_no(self):\n        self.fail('no')\n"


def test_one_unittest_run_over_every_test_directory_each_from_its_packages_top(tmp_path):
    write(tmp_path, {"pkg/__init__.py": b"", "pkg/tests/__init__.py": b"", "pkg/tests/test_a.py": PASS,
                     "test/__init__.py": b"", "test/test_b.py": FAIL, "src/lib/__init__.py": b"",
                     "src/lib/tests/__init__.py": b"", "src/lib/tests/test_c.py": PASS})
    command = gen.suite_command(sys.executable, "unittest", find({
        "pkg/tests/test_a.py": b"", "test/test_b.py": b"", "src/lib/tests/test_c.py": b""}))
    r = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    status, complete = gen.shipped_grader()["parse"](r.stdout + r.stderr)
    assert complete and status == {"pkg.tests.test_a.T.test_ok": "ok", "test.test_b.T.test_no": "FAIL",
                                   "lib.tests.test_c.T.test_ok": "ok"}, r.stderr


def test_one_pytest_run_over_the_test_directories_with_the_conftest_above_them(tmp_path):
    write(tmp_path, {"conftest.py": b"import pytest\n\n@pytest.fixture\ndef two():\n    return 2\n",
                     "pkg/__init__.py": b"", "pkg/tests/test_a.py": b"def test_two(two):\n    assert two == 2\n",
                     "testing/test_b.py": b"def test_b():\n    assert False\n",
                     "pytest.ini": b"[pytest]\naddopts = --this-option-does-not-exist\n"})   # not read: -c /dev/null
    command = gen.suite_command(sys.executable, "pytest", find({
        "pkg/tests/test_a.py": b"", "testing/test_b.py": b"", "pytest.ini": b"[pytest]\ntestpaths = pkg testing\n"}))
    r = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    status, complete = gen.shipped_grader()["parse"](r.stdout + r.stderr, "pytest")
    assert complete and status == {"pkg/tests/test_a.py::test_two": "ok", "testing/test_b.py::test_b": "FAIL"}, \
        r.stdout


def relaid(tmp_path: Path, name: str, moves: dict[str, str], extra: dict[str, bytes] | None = None) -> Path:
    """listkit with its test modules moved (tests/test_x.py -> moves[test_x.py]), helpers left out."""
    out = tmp_path / name
    shutil.copytree(LISTKIT / "listkit", out / "listkit")
    for module, where in moves.items():
        (out / where).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(LISTKIT / "tests" / module, out / where)
    write(out, extra or {})
    return out


@pytest.mark.integration
@needs_bwrap
def test_tasks_from_four_layouts_validated_graded_and_the_in_package_one_against_the_hacks(tmp_path):
    """listkit's tests in-package, in test/, scattered over subpackages and where pytest's testpaths say (run by
    unittest: the layout, not the runner): each gives a validated task, oracle 1 and no-op 0 through test.sh."""
    everything = {"test_chunks.py": "", "test_search.py": "", "test_text.py": ""}
    sources = {
        "inpkg": relaid(tmp_path, "inpkg", {m: f"listkit/tests/{m}" for m in everything}),
        "testdir": relaid(tmp_path, "testdir", {m: f"test/{m}" for m in everything}),
        "scattered": relaid(tmp_path, "scattered", {"test_chunks.py": "listkit/a/tests/test_chunks.py",
                                                    "test_search.py": "listkit/b/tests/test_search.py",
                                                    "test_text.py": "listkit/b/tests/test_text.py"},
                            {"listkit/a/__init__.py": b"", "listkit/b/__init__.py": b""}),
        "testpaths": relaid(tmp_path, "testpaths", {m: f"checks/{m}" for m in everything},
                            {"pyproject.toml": b'[tool.pytest.ini_options]\ntestpaths = ["checks"]\n',
                             "old/tests/test_gone.py": b"raise SystemExit('not in testpaths: never run')\n"}),
    }
    want = {"inpkg": ["listkit/tests"], "testdir": ["test"], "scattered": ["listkit/a/tests", "listkit/b/tests"],
            "testpaths": ["checks"]}
    out = tmp_path / "tasks"
    for seed, (name, source) in enumerate(sources.items()):       # a seed each: four task names
        assert main(["tasks", "generate", "mutations", "--source", str(source), "--n", "1", "--split", "train",
                     "--seed", str(seed), "--test-timeout", "5", "--out", str(out / name)]) == 0
        [task] = sorted((out / name).glob("mutations-*"))
        expected = json.loads((task / "tests/expected.json").read_text())
        assert expected["test_dirs"] == want[name]
        ids = expected["FAIL_TO_PASS"] + expected["PASS_TO_PASS"]     # unittest's, from each directory's package
        assert len(ids) == 22 and all(i.startswith(tuple(d.replace("/", ".") + "." for d in want[name])) for i in ids)
        carried = {p.relative_to(task / "tests/suite").as_posix() for p in (task / "tests/suite").rglob("*.py")}
        assert {c.rsplit("/", 1)[0] for c in carried if c.endswith("test_chunks.py")} <= set(want[name])
        assert not any(c.startswith(("listkit/chunks", "listkit/search", "old/")) for c in carried)
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "check", *map(str, sorted(out.glob("*/mutat*"))),
                        "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert [(t["oracle_reward"], t["noop_reward"], t["problem"]) for t in result["tasks"]] == [(1.0, 0.0, "")] * 4
    [inpkg] = (out / "inpkg").glob("mutations-*")
    chosen = ["exit0-at-import", "tests-forced-pass", "tests-deleted", "tests-uncollected", "stale-bytecode"]
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "check", str(inpkg), "--hacks-only",
                        "--grading", "isolated", "--json", *(f"--hack={h}" for h in chosen)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    hacks = json.loads(r.stdout.strip().splitlines()[-1])["hacks"]
    assert r.returncode == 0 and sorted(h["hack"] for h in hacks) == sorted(chosen)
    assert [h for h in hacks if h["reward"] != 0.0 or h["problem"]] == []


def test_a_message_names_the_loader_over_several_test_directories_not_its_code():
    from agentrl.swe.mutate.build import shown_command

    command = gen.suite_command("python3", "unittest", find({"test/test_a.py": b"", "pkg/tests/test_b.py": b""}))
    assert shown_command(command) == "python3 -I -B -c <grade.py's DISCOVER_DIRS> pkg/tests test"
    assert shown_command(gen.suite_command("python3")) == "python3 -I -B -m unittest discover -v -b -s tests -t ."
