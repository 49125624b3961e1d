"""Copy the verifier's one source (agentrl/swe/verifier/: test.sh, grade.py) into every bundled task (`make verifier`).

A Harbor task directory is self-contained, so each bundled task ships the verifier's bytes in its tests/;
tests/test_task_generate.py fails when a copy differs from the source. Edit agentrl/swe/verifier/, then run this.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentrl.swe.generate import verifier_files
from agentrl.swe.harbor import BUNDLED_TASKS


def stale_copies(tasks: Path = BUNDLED_TASKS) -> dict[Path, bytes]:
    """Each task's copy that differs from the source (or is missing), with the bytes it should hold."""
    source = verifier_files()
    return {path: data for task in sorted(tasks.iterdir()) if (task / "task.toml").exists()
            for name, data in source.items()
            if not (path := task / "tests" / name).exists() or path.read_bytes() != data}


def main(argv: list[str] | None = None) -> int:
    """Rewrite the stale copies under DIR (default: the bundled tasks)."""
    args = sys.argv[1:] if argv is None else argv
    stale = stale_copies(Path(args[0]) if args else BUNDLED_TASKS)
    for path, data in stale.items():
        path.write_bytes(data)
        path.chmod(0o755 if path.suffix == ".sh" else 0o644)
        print(f"wrote {path}")
    print(f"{len(stale)} stale copies of the verifier rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
