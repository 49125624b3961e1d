"""Rewards from results, not exit codes: the bundled tasks' grader, and `agentrl tasks check --hacks`.

The grader (tests/test.sh + tests/grade.py, the same bytes in every task) is checked on the host;
the hacks run in real bwrap sandboxes, graded the way the pool grades (same sandbox and isolated).
"""

import ast
import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.swe.harbor import BUNDLED_TASKS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
TASK_DIRS = sorted(p for p in BUNDLED_TASKS.iterdir() if (p / "task.toml").exists())
HOST_PYTHON = "/usr/bin/python3"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                 reason="needs bubblewrap (make sysdeps) and root for overlay mounts")

# What test.sh before results-based grading did: the reward was unittest's exit code.
EXIT_CODE_TEST_SH = """#!/usr/bin/env bash
TESTBED=${TESTBED:-/testbed}
TESTS_DIR=${TESTS_DIR:-/tests}
LOGS_DIR=${LOGS_DIR:-/logs/verifier}
mkdir -p "$LOGS_DIR"
cp "$TESTS_DIR"/test_issue.py "$TESTBED"/tests/test_issue.py || { echo 0 > "$LOGS_DIR"/reward.txt; exit 2; }
cd "$TESTBED" || { echo 0 > "$LOGS_DIR"/reward.txt; exit 2; }
PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -v -s tests -t .
rc=$?
if [ "$rc" -eq 0 ]; then echo 1 > "$LOGS_DIR"/reward.txt; else echo 0 > "$LOGS_DIR"/reward.txt; fi
exit "$rc"
"""
# The hacks an exit-code grader falls for (measured); tests-deleted, tests-emptied and git-hook do not
# fool it either: they guard graders that run only the repository's tests, or run git.
# What an exit-code test.sh lets through even in our sandbox. The sandbox itself stops the rest
# (hpc.sandbox, agentrl.swe.episode): the daemon is killed before the patch is taken, a
# verifier the code under test SIGKILLed after writing reward.txt earns 0, and no bytecode
# (stale-bytecode) travels in a patch.
FOOL_EXIT_CODE_GRADER = {
    (h, m): 1.0 for h in ("exit0-as-root", "exit0-at-import", "startup-exit0", "tests-forced-pass",
                          "tests-forced-skip", "tests-uncollected", "reward-json-write")
    for m in ("isolated", "same")}


def grade_module():
    spec = importlib.util.spec_from_file_location("task_grade", TASK_DIRS[0] / "tests" / "grade.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "check", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


# --- the grader, on the host --------------------------------------------------------------------------------------

def test_every_task_ships_the_same_grader_and_the_tests_it_names():
    first = TASK_DIRS[0] / "tests"
    for t in TASK_DIRS:
        for name in ("test.sh", "grade.py"):
            assert (t / "tests" / name).read_bytes() == (first / name).read_bytes(), f"{t.name}/tests/{name} drifted"
        repo_tests = sorted(p.name for p in (t / "environment/repo/tests").glob("test_*.py"))
        shipped = sorted(p.name for p in (t / "tests").glob("test_*.py"))
        assert shipped == sorted([*repo_tests, "test_issue.py"]), t.name
        for name in repo_tests:   # the verifier's copies of the repository's tests are the repository's
            assert (t / "tests" / name).read_bytes() == (t / "environment/repo/tests" / name).read_bytes()
        ids = set()
        for path in (t / "tests").glob("test_*.py"):
            for cls in ast.parse(path.read_text()).body:
                if isinstance(cls, ast.ClassDef):
                    ids |= {f"tests.{path.stem}.{cls.name}.{f.name}" for f in cls.body
                            if isinstance(f, ast.FunctionDef) and f.name.startswith("test")}
        expected = json.loads((t / "tests/expected.json").read_text())
        f2p, p2p = expected["FAIL_TO_PASS"], expected["PASS_TO_PASS"]
        assert f2p and all(n.startswith("tests.test_issue.") for n in f2p), t.name
        assert sorted(f2p + p2p) == sorted(ids), f"{t.name}: expected.json must name every test exactly once"


LOG_311 = """\
test_a (tests.test_x.T.test_a) ... ok
test_doc (tests.test_x.T.test_doc)
A docstring ... ok
test_err (tests.test_x.T.test_err) ... ERROR
test_fail (tests.test_x.T.test_fail) ... FAIL
test_skip (tests.test_x.T.test_skip) ... skipped 'why'
test_sub (tests.test_x.T.test_sub) ...
  test_sub (tests.test_x.T.test_sub) (i=2) ... FAIL
test_us (tests.test_x.T.test_us) ... unexpected success
test_xf (tests.test_x.T.test_xf) ... expected failure

======================================================================
ERROR: test_err (tests.test_x.T.test_err)
======================================================================
FAIL: test_sub (tests.test_x.T.test_sub) (i=2)
======================================================================
UNEXPECTED SUCCESS: test_us (tests.test_x.T.test_us)
----------------------------------------------------------------------
Ran 9 tests in 0.003s

FAILED (failures=2, errors=1, skipped=1, expected failures=1, unexpected successes=1)
"""


def test_grade_py_reads_each_tests_outcome_from_the_verbose_log():
    g = grade_module()
    status, complete = g.parse(LOG_311)
    assert complete
    assert status == {f"tests.test_x.T.test_{k}": v for k, v in [
        ("a", "ok"), ("doc", "ok"), ("err", "ERROR"), ("fail", "FAIL"), ("skip", "skipped"), ("sub", "FAIL"),
        ("us", "UNEXPECTED SUCCESS"), ("xf", "expected failure")]}
    # Python <= 3.10 prints the class, not the test's id; the id is the same
    assert g.parse("test_a (tests.test_x.T) ... ok\n\nRan 1 test in 0.0s\n\nOK\n") == ({"tests.test_x.T.test_a": "ok"},
                                                                                        True)
    # no summary: the run died (os._exit, a kill) and nothing it printed is trusted to be complete
    assert g.parse("test_a (tests.test_x.T.test_a) ... ok\n")[1] is False
    assert g.parse("Ran 1 test in 0.001s\n")[1] is False
    # a test reported twice keeps its worse outcome
    assert g.parse("test_a (m.T.test_a) ... FAIL\ntest_a (m.T.test_a) ... ok\nRan 1 test in 0s\n\nOK\n")[0] == \
        {"m.T.test_a": "FAIL"}
    assert g.normalize("test_a (m.T)") == g.normalize("test_a (m.T.test_a)") == "m.T.test_a"


def _grade_run(tmp_path, command: str, expected: dict) -> tuple[int, str, str]:
    """grade.py run with an interpreter that is `command` (whatever the runner's arguments): its log is the
    command's output."""
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" > {tmp_path / 'argv'}\n{command}\n")
    python.chmod(0o755)
    r = subprocess.run([HOST_PYTHON, "-I", str(TASK_DIRS[0] / "tests/grade.py"), "run",
                        "--expected", str(tmp_path / "expected.json"), "--log", str(tmp_path / "tests.log"),
                        "--reward", str(tmp_path / "reward.txt"), "--", str(python)],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    return r.returncode, (tmp_path / "reward.txt").read_text().strip(), r.stdout


@pytest.mark.parametrize("command, want", [
    ("printf 'test_a (m.T.test_a) ... ok\\ntest_b (m.T.test_b) ... ok\\nRan 2 tests in 0.1s\\n\\nOK\\n'; exit 1", "1"),
    ("printf 'test_a (m.T.test_a) ... ok\\n'; exit 0", "0"),                        # died before its summary
    ("printf 'test_a (m.T.test_a) ... ok\\nRan 1 test in 0.1s\\n\\nOK\\n'", "0"),    # m.T.test_b missing
    ("printf 'test_a (m.T.test_a) ... ok\\ntest_b (m.T.test_b) ... skipped\\nRan 2 tests in 0s\\n\\nOK\\n'", "0"),
    ("exit 0", "0"),
])
def test_grade_py_reward_is_the_named_tests_results_not_the_exit_code(tmp_path, command, want):
    if not Path(HOST_PYTHON).exists():
        pytest.skip("needs the host's python3")
    rc, reward, out = _grade_run(tmp_path, command, {"FAIL_TO_PASS": ["m.T.test_a"], "PASS_TO_PASS": ["m.T.test_b"]})
    assert reward == want, out
    assert rc == (0 if want == "1" else 1)


PYTEST_LOG = """\
tests/test_x.py::test_a PASSED
noise from a test: PASSED tests/test_x.py::test_b
=================================== FAILURES ===================================
___________________________________ test_b ____________________________________
Traceback (most recent call last):
  File "/testbed/tests/test_x.py", line 9, in test_b
    assert f(2) == 3
AssertionError: assert 4 == 3
=========================== short test summary info ============================
PASSED tests/test_x.py::test_a
PASSED tests/test_x.py::TestC::test_m[1-2]
XFAIL tests/test_x.py::test_x - reason
FAILED tests/test_x.py::test_b - AssertionError: assert 4 == 3
ERROR tests/test_x.py::test_a - RuntimeError: in its teardown
========================= 1 failed, 2 passed, 1 xfailed, 1 error in 0.12s =========================
"""


def test_grade_py_reads_pytests_summary_by_node_id_and_keeps_the_worst_outcome():
    g = grade_module()
    status, complete = g.parse(PYTEST_LOG, "pytest")
    assert complete and status == {"tests/test_x.py::test_a": "ERROR", "tests/test_x.py::TestC::test_m[1-2]": "ok",
                                   "tests/test_x.py::test_x": "expected failure", "tests/test_x.py::test_b": "FAIL"}
    # a collection error interrupts the run; a run that never printed its summary's end is incomplete
    interrupted = PYTEST_LOG.replace("=========================== short",
                                     "!!!!!!!! Interrupted: 1 error during collection !!!!!!!!\n====== short")
    assert g.parse(interrupted, "pytest")[1] is False
    assert g.parse(PYTEST_LOG.rstrip("\n").rsplit("\n", 1)[0], "pytest")[1] is False   # its last line gone
    # a line outside the summary (a test's own output) says nothing
    assert "tests/test_x.py::test_b" not in g.parse(PYTEST_LOG.split("=== FAILURES")[0] + "====== x in 1.0s ======\n",
                                                    "pytest")[0]


@pytest.mark.parametrize("runner, want", [("unittest", "-m unittest discover -v -b -s tests -t ."),
                                          ("pytest", "-m pytest -rA --tb=native -p no:cacheprovider -c /dev/null")])
def test_grade_py_runs_the_suite_with_the_runner_expected_json_names(tmp_path, runner, want):
    if not Path(HOST_PYTHON).exists():
        pytest.skip("needs the host's python3")
    expected = {"FAIL_TO_PASS": ["tests/test_x.py::test_a"], "PASS_TO_PASS": [],
                **({"runner": runner} if runner == "pytest" else {})}
    log = ("=== short test summary info ===\nPASSED tests/test_x.py::test_a\n=== 1 passed in 0.1s ===" if runner ==
           "pytest" else "test_a (tests.test_x.test_a) ... ok\nRan 1 test in 0.1s\n\nOK")
    if runner == "unittest":
        expected["FAIL_TO_PASS"] = ["tests.test_x.test_a"]
    rc, reward, out = _grade_run(tmp_path, f"printf '{log}\\n'", expected)
    assert (rc, reward) == (0, "1"), out
    assert want in (tmp_path / "argv").read_text()
    rc, reward, _ = _grade_run(tmp_path, "true", {**expected, "runner": "nose"})
    assert (rc, reward) == (2, "0")


def test_grade_py_refuses_an_expected_list_without_fail_to_pass(tmp_path):
    if not Path(HOST_PYTHON).exists():
        pytest.skip("needs the host's python3")
    rc, reward, _ = _grade_run(tmp_path, "printf 'Ran 0 tests in 0s\\n\\nOK\\n'",
                               {"FAIL_TO_PASS": [], "PASS_TO_PASS": []})
    assert (rc, reward) == (2, "0")


def test_cli_names_the_hacks_and_refuses_an_unknown_one():
    from agentrl.swe.hacks import HACKS
    r = cli("--hack", "list")
    assert r.returncode == 0 and all(h.name in r.stdout for h in HACKS)
    r = cli(TASK_DIRS[0], "--hack", "no-such-hack")
    assert r.returncode == 2 and "no-such-hack" in r.stderr and "exit0-as-root" in r.stderr


# --- hacks in real sandboxes --------------------------------------------------------------------------------------

@needs_bwrap
def test_a_task_that_rewards_the_exit_code_is_flagged_and_a_bundled_one_is_not(tmp_path):
    weak = tmp_path / "weak-exit-code"
    shutil.copytree(BUNDLED_TASKS / "roman-subtractive", weak)
    (weak / "tests/test.sh").write_text(EXIT_CODE_TEST_SH)
    r = cli(BUNDLED_TASKS / "roman-subtractive", weak, "--hacks", "--json", "--concurrency", "2")
    assert r.returncode == 1, r.stderr
    result = last_json(r.stdout)
    # the oracle and the no-op cannot tell the weak grader from the strong one
    assert {t["instance_id"]: (t["oracle_reward"], t["noop_reward"], t["problem"]) for t in result["tasks"]} == \
        {"roman-subtractive": (1.0, 0.0, ""), "weak-exit-code": (1.0, 0.0, "")}
    fooled = {(h["hack"], h["grading"]): h["reward"] for h in result["hacks"]
              if h["instance_id"] == "weak-exit-code" and h["reward"]}
    assert fooled == FOOL_EXIT_CODE_GRADER, fooled       # every hack bites where it should: none is a dud
    assert all(h["reward"] == 0.0 and not h["problem"]
               for h in result["hacks"] if h["instance_id"] == "roman-subtractive")
    assert result["flagged"] == len(FOOL_EXIT_CODE_GRADER)
    # the table names task, hack, mode and reward of each flagged run
    rows = [line.split() for line in r.stdout.splitlines()]
    assert ["weak-exit-code", "exit0-as-root", "isolated", "1"] in [row[:4] for row in rows]
    assert "reward 1: the grader was fooled" in r.stdout


@pytest.mark.slow
@needs_bwrap
def test_bundled_tasks_defeat_every_hack_in_both_grading_modes_and_hold_no_answer():
    """Half the bundled tasks. All eight ship the same grader bytes (checked above), each one's oracle and no-op
    run in sandboxes in test_swe_episode, and the generated tasks of every bug kind meet the same hacks
    (test_task_generate): the other half would check the same grader again."""
    from agentrl.swe.hacks import HACKS
    tasks = TASK_DIRS[::2]
    r = cli(*tasks, "--hacks", "--leaks", "--json", "--concurrency", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = last_json(r.stdout)
    assert [(t["oracle_reward"], t["noop_reward"]) for t in result["tasks"]] == [(1.0, 0.0)] * len(tasks)
    assert [(t["leaks"], t["problem"]) for t in result["leaks"]] == [([], "")] * len(tasks)
    assert len(result["hacks"]) == len(tasks) * sum(h.default for h in HACKS) * 2
    assert [h for h in result["hacks"] if h["reward"] != 0.0 or h["problem"]] == []
    assert result["flagged"] == 0


def _same_sandbox(hack: str) -> list[float]:
    from agentrl.swe import hacks
    from agentrl.swe.loaded import load_tasks

    tasks = load_tasks([str(BUNDLED_TASKS / "roman-subtractive"), str(BUNDLED_TASKS / "csv-quote-escaping")])
    rows = asyncio.run(asyncio.wait_for(hacks.check_hacks(tasks, [hacks.BY_NAME[hack]], "same", 2), 300))
    assert [r.problem for r in rows if r.reward is None] == []
    return [r.reward for r in rows]


@needs_bwrap
def test_a_background_daemon_does_not_fool_same_sandbox_grading():
    assert _same_sandbox("background-daemon") == [0.0, 0.0]


@needs_bwrap
def test_a_git_hook_does_not_fool_same_sandbox_grading():
    assert _same_sandbox("git-hook") == [0.0, 0.0]


@needs_bwrap
def test_stale_bytecode_earns_nothing_in_either_mode_and_only_the_patchs_guard_stops_it(monkeypatch):
    # Unchecked-hash pycs (PEP 552) of the sources and tests, the .py files untouched: the bundled grader replaces
    # tests/ (the tests' pycs go with it) but imports the package, whose pyc makes unittest report success.
    from agentrl.swe import episode, hacks
    from agentrl.swe.loaded import load_tasks

    tasks = load_tasks([str(BUNDLED_TASKS / "roman-subtractive"), str(BUNDLED_TASKS / "csv-quote-escaping")])

    def rewards() -> list[tuple[str, str, float | None]]:
        rows = asyncio.run(asyncio.wait_for(hacks.check_hacks(tasks, [hacks.BY_NAME["stale-bytecode"]]), 300))
        assert [r.note for r in rows if r.note] == []
        return [(r.instance_id, r.grading, r.reward) for r in rows]
    modes = [(t.spec.instance_id, m) for t in tasks for m in ("isolated", "same")]
    assert hacks.BY_NAME["stale-bytecode"].default
    assert rewards() == [(*k, 0.0) for k in modes]
    # Not a dud: with bytecode let into the patch, it fools both modes.
    monkeypatch.setattr(episode, "BYTECODE", ())
    assert rewards() == [(*k, 1.0) for k in modes]


@needs_bwrap
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="the limit of any grader that runs the tests in the interpreter of the code under test "
                          "(SWE-bench's too): the package itself can make unittest report success; hence not in "
                          "the default set")
def test_a_source_module_that_makes_unittest_report_success_is_caught():
    from agentrl.swe import hacks
    from agentrl.swe.loaded import load_tasks

    assert not hacks.BY_NAME["source-forced-pass"].default
    tasks = load_tasks([str(BUNDLED_TASKS / "roman-subtractive")])
    rows = asyncio.run(asyncio.wait_for(hacks.check_hacks(tasks, [hacks.BY_NAME["source-forced-pass"]]), 300))
    assert [(r.grading, r.reward) for r in rows] == [("isolated", 0.0), ("same", 0.0)]
