"""Counting a process's file-system calls: each is a round trip to the server on NFS or Lustre.

`counted()` wraps, for the length of a `with`, the os and io functions through which Python (pathlib
and os.path included) reaches the filesystem by path or syncs a file. Counted, not timed: the figure is
what a shared filesystem's server would see, whatever this machine's disk is like.
"""

from __future__ import annotations

import io
import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# The calls that name a path (or sync a file); reads and writes of an open descriptor are not round
# trips of their own on NFS (they are cached and flushed by the fsync that is counted).
FS_CALLS = ("stat", "lstat", "open", "link", "rename", "replace", "unlink", "mkdir", "rmdir", "listdir",
            "scandir", "utime", "chmod", "fsync")


@contextmanager
def counted() -> Iterator[Counter]:
    """A Counter of the file-system calls made inside the block, by name (io.open counts as open)."""
    calls: Counter = Counter()
    saved: dict[tuple[Any, str], Callable] = {(os, name): getattr(os, name) for name in FS_CALLS}
    saved[(io, "open")] = io.open

    def counting(name: str, real: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)
        return call

    for (module, name), real in saved.items():
        setattr(module, name, counting(name, real))
    try:
        yield calls
    finally:
        for (module, name), real in saved.items():
            setattr(module, name, real)
