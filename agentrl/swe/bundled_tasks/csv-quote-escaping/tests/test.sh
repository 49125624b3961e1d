#!/usr/bin/env bash
# Harbor verifier. The reward comes from per-test results, as in SWE-bench, never from an
# exit code: grade.py runs the suite as the work tree's owner (not root), reads its verbose
# log and writes reward 1 only if every test that expected.json names passed.
# Paths come from the environment with Harbor's defaults, so the same script runs in a
# sandbox and, remapped, on a plain host. The same file in every task (agentrl/swe/verifier/).
TESTBED=${TESTBED:-/testbed}
TESTS_DIR=${TESTS_DIR:-/tests}
LOGS_DIR=${LOGS_DIR:-/logs/verifier}
PYTHON=${PYTHON:-python3}

mkdir -p "$LOGS_DIR"
rm -f "$LOGS_DIR"/reward.json
echo 0 > "$LOGS_DIR"/reward.txt
cd "$TESTBED" || exit 2
# -I: neither the work tree nor PYTHON* variables shape the interpreter (no shadowed stdlib).
grade() { "$PYTHON" -I "$TESTS_DIR"/grade.py "$@"; }
# Nothing of the test user's (when grading in the agent's sandbox: the agent's) runs on.
grade stop || exit 2
# The verifier's copies replace the repository's tests: deleted, emptied or edited test
# files or a tests/__init__.py of the agent's do not count. A task whose tests need more than
# their modules (helpers, data, an __init__.py of their own) ships the whole tree as suite/,
# at the tests' own paths when they are not in tests/ (expected.json's test_dirs).
grade place "$TESTS_DIR" || exit 2
# grade.py runs the suite with $PYTHON: unittest, or pytest if expected.json says so.
grade run --expected "$TESTS_DIR"/expected.json --log "$LOGS_DIR"/tests.log --reward "$LOGS_DIR"/reward.txt \
    -- "$PYTHON"
rc=$?
rm -f "$LOGS_DIR"/reward.json   # grade.py's reward.txt is the only reward
exit "$rc"
