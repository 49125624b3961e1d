#!/usr/bin/env bash
# Reference solution: rewrites the buggy lines in place. Fails loudly if the
# code is not the version this fix was written for.
set -euo pipefail
TESTBED=${TESTBED:-/testbed}
PYTHON=${PYTHON:-python3}
"$PYTHON" - "$TESTBED" <<'PY'
import pathlib
import sys

def fix(rel, old, new):
    path = pathlib.Path(sys.argv[1]) / rel
    text = path.read_text()
    if text.count(old) != 1:
        sys.exit(f"{path}: expected the buggy code exactly once")
    path.write_text(text.replace(old, new))

fix('roman/convert.py', '(10, "X"), (5, "V"), (1, "I"),', '(10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),')
PY
