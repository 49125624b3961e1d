"""Waiting on another process: poll a predicate until it holds, or fail naming what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str = "the condition", poll_s: float = 0.2) -> T:
    """The predicate's first truthy value; AssertionError after `timeout` seconds without one. Five polls a
    second: a predicate may run squeue or read a run's records, and polling faster takes the CPU the
    processes waited on need (2 cores under CI)."""
    deadline = time.monotonic() + timeout
    while True:
        if value := predicate():
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll_s)
