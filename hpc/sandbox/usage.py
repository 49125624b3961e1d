"""What one sandbox has taken of its limits, and which limits its processes ran into (pure).

The supervisor reads the figures (its cgroup's counters, statvfs of the disk and /tmp) and the
owner decides from them: a limit the agent ran into makes a failed command, or a sandbox that
died, the agent's outcome (trained, reward 0, the limit named) instead of an infrastructure
failure to retry. The causes are the kernel's own records, not a guess from an error message:
    memory   the cgroup's OOM kills, or its unreclaimable memory (processes and tmpfs) at the limit
    pids     forks the pids controller refused
    storage  the disk (writable layers and HOME) full
    tmp      /tmp full
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

LIMITS = ("memory", "pids", "storage", "tmp", "time")
_FULL_FRACTION = 0.01           # a filesystem with less than this share free (or 4 MiB) is full
_FULL_MIN_BYTES = 4 << 20
_MEMORY_AT_LIMIT = 0.95         # unreclaimable memory at this share of the limit: no more to give


def parse_flat(text: str) -> dict[str, int]:
    """`key value` lines (memory.stat, memory.events, memory.oom_control, pids.events)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


@dataclass(frozen=True)
class Usage:
    """One reading of a sandbox. Bytes; 0 where a figure was not available."""

    alive: bool = True          # False: its init is gone (read as it died)
    memory_limit: int = 0       # 0: not limited here
    anon: int = 0               # its processes' memory
    shmem: int = 0              # tmpfs pages: /tmp, and the disk where it is a tmpfs
    cache: int = 0              # page cache (reclaimable: the kernel writes it back and frees it)
    oom_kills: int = 0
    pids_refused: int = 0       # forks refused at the pids limit
    disk_backing: str = ""      # "disk", "tmpfs" or "dir" (hpc.sandbox.storage); "" unknown
    disk_size: int = 0
    disk_free: int = 0
    tmp_size: int = 0
    tmp_free: int = 0

    @property
    def ram(self) -> int:
        """What the node cannot take back from it: processes and tmpfs pages."""
        return self.anon + self.shmem

    def limits_hit(self) -> tuple[str, ...]:
        """The limits its processes ran into, in LIMITS' order."""
        return (*(("memory",) if self.oom_kills or self._memory_held() else ()),
                *(("pids",) if self.pids_refused else ()), *self._full())

    def exhausted(self) -> tuple[str, ...]:
        """The limits it is at now, with its commands killed (what would make grading fail there):
        tmpfs pages holding its memory, its disk or /tmp full."""
        return (*(("memory",) if self._memory_held() else ()), *self._full())

    def _memory_held(self) -> bool:
        return bool(self.memory_limit) and self.ram >= _MEMORY_AT_LIMIT * self.memory_limit

    def _full(self) -> tuple[str, ...]:
        disk = self.disk_backing in ("disk", "tmpfs") and _full(self.disk_size, self.disk_free)
        return (*(("storage",) if disk else ()), *(("tmp",) if _full(self.tmp_size, self.tmp_free) else ()))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Usage:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def dead(usage: Usage | None) -> Usage:
    """A reading of a sandbox that died: as it was read when it did (nothing, if it was not)."""
    return replace(usage or Usage(), alive=False)


def _full(size: int, free: int) -> bool:
    return size > 0 and free <= max(_FULL_MIN_BYTES, size * _FULL_FRACTION)


def cgroup_figures(files: dict[str, str]) -> dict[str, int]:
    """Usage's cgroup fields from the cgroup's files by name (v1 or v2; a missing file is absent)."""
    stat = parse_flat(files.get("memory.stat", ""))
    shmem = stat.get("shmem", 0)
    # v1's cache and v2's file both count tmpfs pages too
    out = {"anon": stat.get("anon", stat.get("rss", 0)), "shmem": shmem,
           "cache": max(0, stat.get("file", stat.get("cache", 0)) - shmem)}
    events = parse_flat(files.get("memory.events", "") or files.get("memory.oom_control", ""))
    out["oom_kills"] = events.get("oom_kill", 0)
    out["pids_refused"] = parse_flat(files.get("pids.events", "")).get("max", 0)
    limit = (files.get("memory.max") or files.get("memory.limit_in_bytes") or "").strip()
    # v1's "no limit" is a huge number, v2's is "max"
    out["memory_limit"] = int(limit) if limit.isdigit() and int(limit) < 1 << 60 else 0
    return out
