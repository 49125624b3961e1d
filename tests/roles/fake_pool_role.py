"""A pool role for launcher tests: the stand-in pool (tests/fake_pool.py) on $AGENTRL_RUN_DIR until SIGTERM.

Its samples are a pure function of (rollout, group, attempt), so runs that should agree (one
uninterrupted, one stopped and continued) see the same data.
"""

import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # tests/: fake_pool
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))     # the project: hpc

from fake_pool import FakePool  # noqa: E402


def main() -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with FakePool(Path(os.environ["AGENTRL_RUN_DIR"]), worker_id=f"fake-pool-{os.getpid()}"):
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
