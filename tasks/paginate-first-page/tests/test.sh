#!/usr/bin/env bash
# Harbor verifier: copy the hidden tests into the repository, run the whole
# unittest suite (the issue's tests and the existing ones), write the reward.
# Paths come from the environment with Harbor's defaults, so the same script
# runs in a sandbox and, remapped, on a plain host.
TESTBED=${TESTBED:-/testbed}
TESTS_DIR=${TESTS_DIR:-/tests}
LOGS_DIR=${LOGS_DIR:-/logs/verifier}
PYTHON=${PYTHON:-python3}

mkdir -p "$LOGS_DIR"
cp "$TESTS_DIR"/test_issue.py "$TESTBED"/tests/test_issue.py || { echo 0 > "$LOGS_DIR"/reward.txt; exit 2; }
cd "$TESTBED" || { echo 0 > "$LOGS_DIR"/reward.txt; exit 2; }
PYTHONDONTWRITEBYTECODE=1 "$PYTHON" -m unittest discover -v -s tests -t .
rc=$?
if [ "$rc" -eq 0 ]; then echo 1 > "$LOGS_DIR"/reward.txt; else echo 0 > "$LOGS_DIR"/reward.txt; fi
exit "$rc"
