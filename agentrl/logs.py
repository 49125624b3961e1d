"""One logging setup for every role's command: INFO and up to stderr, with the time and the logger."""

from __future__ import annotations

import logging
import sys


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)      # one line per model call drowns the log
