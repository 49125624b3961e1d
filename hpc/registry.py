"""Service discovery over the run directory: services/<role>-<i>.json plus heartbeats.

A role instance registers once and renews its heartbeat; readers list the
services whose heartbeat is recent. Each file has a single writer (the service
itself), replaced atomically, so readers never see a torn record.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from .fsio import read_bytes
from .records import Record, parse_record, write_record

_ROLE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def task_role(role: str) -> str:
    """The name a launched task's wrapper registers under: `task_<role>`, beside (never over) what
    the task's own service registers as `<role>` (an inference server with its port and weights)."""
    return f"task_{role}"


class ServiceRecord(Record):
    kind: Literal["service"] = "service"
    role: str
    index: int
    host: str
    port: int | None = None
    socket: str | None = None
    weight_version: int | None = None
    started: float
    heartbeat: float


class Registry:
    def __init__(self, services_dir: Path | str, clock: Callable[[], float] = time.time):
        self.dir = Path(services_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        # Each record as this reader last read it: a network filesystem's client can fail to open a name
        # whose file was just replaced (its entry cache names the old file) for up to that cache's
        # timeout, and the record read before stands in, its heartbeat as old as it is.
        self._seen: dict[str, ServiceRecord] = {}

    def path(self, role: str, index: int) -> Path:
        return self.dir / f"{role}-{index}.json"

    def register(self, role: str, index: int, *, host: str, port: int | None = None,
                 socket: str | None = None, weight_version: int | None = None) -> ServiceRecord:
        if not _ROLE.match(role):
            raise ValueError(f"role {role!r}: lowercase letters, digits and _ only, starting with a letter")
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port {port} is outside 1..65535")
        now = self._clock()
        rec = ServiceRecord(role=role, index=index, host=host, port=port, socket=socket,
                            weight_version=weight_version, started=now, heartbeat=now)
        write_record(self.path(role, index), rec)
        return rec

    def heartbeat(self, rec: ServiceRecord, *, weight_version: int | None = None) -> ServiceRecord:
        """Renew `rec`'s heartbeat (and weight_version, if given); returns the new record."""
        update = {"heartbeat": self._clock()}
        if weight_version is not None:
            update["weight_version"] = weight_version
        new = rec.model_copy(update=update)
        # Heartbeats are not fsynced: losing one in a crash only makes the service look older.
        write_record(self.path(rec.role, rec.index), new, fsync=False)
        return new

    def deregister(self, rec: ServiceRecord) -> None:
        try:
            os.unlink(self.path(rec.role, rec.index))
        except FileNotFoundError:
            pass

    def services(self, role: str | None = None) -> list[ServiceRecord]:
        """Every registered service (of `role`), sorted by role and index. Skips temp files."""
        out = []
        for name in sorted(os.listdir(self.dir)):
            if name.startswith(".") or not name.endswith(".json"):
                continue
            if role is not None and name.rpartition("-")[0] != role:
                continue
            try:
                raw = read_bytes(self.dir / name)
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ESTALE):
                    raise
                if name in self._seen:      # still there, or deregistered as we listed: gone at the next listing
                    out.append(self._seen[name])
                continue
            self._seen[name] = parse_record(self.dir / name, raw, ServiceRecord)
            out.append(self._seen[name])
        return sorted(out, key=lambda r: (r.role, r.index))

    def alive(self, role: str | None = None, ttl_s: float = 30.0) -> list[ServiceRecord]:
        now = self._clock()
        return [r for r in self.services(role) if now - r.heartbeat <= ttl_s]
