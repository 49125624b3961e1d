"""A cgroup per sandbox, nested in the caller's own (Slurm gives each job step one): memory, pids, CPU.

cgroup v1 (a hierarchy per controller, as on this development machine and many clusters) and
cgroup v2 (one unified tree). What a node cannot enforce (no controller, not writable, v2
controllers not delegated) is reported by `Cgroup.create` as `unenforced`: the supervisor says so
once, naming the limit, the reason and what a site does to enable it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .policy import Limits, cgroup_v1_settings

ROOT = Path("/sys/fs/cgroup")
PREFIX = "agentrl-sandbox."
FIGURE_FILES = ("memory.stat", "memory.events", "memory.oom_control", "memory.max", "memory.limit_in_bytes",
                "pids.events")
_V1_FILE = {"memory": "memory_mb", "pids": "pids", "cpu": "cpus"}
_HOW = ("run the pool as root in a cgroup of its own (Slurm: ConstrainRAMSpace/ConstrainCores in "
        "cgroup.conf), with the memory, pids and cpu controllers mounted (v1) or delegated (v2)")


def own_cgroups(proc_cgroup: str) -> dict[str, str]:
    """controller -> path of this process's cgroup ('' is the v2 unified tree), from /proc/self/cgroup."""
    out = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


@dataclass
class Cgroup:
    dirs: list[Path] = field(default_factory=list)
    unenforced: dict[str, str] = field(default_factory=dict)   # limit name -> why

    @classmethod
    def create(cls, name: str, limits: Limits, root: Path = ROOT) -> Cgroup:
        cg = cls()
        wanted = {"memory_mb": limits.memory_mb, "pids": limits.pids, "cpus": limits.cpus}
        wanted = {k: v for k, v in wanted.items() if v}
        if not wanted:
            return cg
        own = own_cgroups(Path("/proc/self/cgroup").read_text())
        if (root / "cgroup.controllers").exists():
            cg._create_v2(root / own.get("", "/").lstrip("/") / name, limits, wanted)
        else:
            cg._create_v1(root, own, name, limits)
        return cg

    def _create_v1(self, root: Path, own: dict[str, str], name: str, limits: Limits) -> None:
        for controller, files in cgroup_v1_settings(limits).items():
            limit = _V1_FILE[controller]
            base = root / controller
            if controller not in own or not base.is_dir():
                self.unenforced[limit] = f"no cgroup v1 {controller} controller mounted at {base}"
                continue
            d = base / own[controller].lstrip("/") / name
            try:
                d.mkdir()
                self.dirs.append(d)
                for f, v in files.items():
                    (d / f).write_text(v)
            except OSError as e:
                self.unenforced[limit] = f"{d}: {e.strerror}"

    def _create_v2(self, d: Path, limits: Limits, wanted: dict) -> None:
        try:
            enabled = set((d.parent / "cgroup.subtree_control").read_text().split())
        except OSError:
            enabled = set()      # every wanted limit is then reported as not delegated
        files = {"memory_mb": ("memory", "memory.max", f"{(limits.memory_mb or 0) << 20}"),
                 "pids": ("pids", "pids.max", str(limits.pids)),
                 "cpus": ("cpu", "cpu.max", f"{int((limits.cpus or 0) * 100000)} 100000")}
        try:
            d.mkdir()
            self.dirs.append(d)
        except OSError as e:
            self.unenforced.update({k: f"{d}: {e.strerror}" for k in wanted})
            return
        for limit in wanted:
            controller, f, v = files[limit]
            if controller not in enabled:
                self.unenforced[limit] = f"the {controller} controller is not delegated to {d.parent}"
                continue
            try:
                (d / f).write_text(v)
            except OSError as e:
                self.unenforced[limit] = f"{d / f}: {e.strerror}"

    def join(self, pid: int = 0) -> None:
        """Move `pid` (0: the caller) into every controller's cgroup; its children follow."""
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid))

    def files(self) -> dict[str, str]:
        """The counters hpc.sandbox.usage reads, by file name (those this node has)."""
        out = {}
        for d in self.dirs:
            for name in FIGURE_FILES:
                try:
                    out[name] = (d / name).read_text()
                except OSError:
                    continue
        return out

    def remove(self, timeout_s: float = 5.0) -> None:
        """rmdir once empty (a killed process leaves its cgroup a moment after it is reaped)."""
        deadline = time.monotonic() + timeout_s
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
        self.dirs = []


def unenforced_message(unenforced: dict[str, str]) -> str:
    items = "; ".join(f"{k} ({why})" for k, why in sorted(unenforced.items()))
    return f"sandbox limits not enforced on this node: {items}. To enforce them, {_HOW}."


def reap_abandoned(alive, root: Path = ROOT) -> None:
    """Remove empty sandbox cgroups whose supervisor (named in the cgroup) is gone."""
    own = own_cgroups(Path("/proc/self/cgroup").read_text())
    bases = [root / c / p.lstrip("/") for c, p in own.items() if c] if not (root / "cgroup.controllers").exists() \
        else [root / own.get("", "/").lstrip("/")]
    for base in bases:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for n in names:
            if n.startswith(PREFIX):
                pid = n[len(PREFIX):].partition(".")[0]
                if pid.isdigit() and not alive(int(pid)):
                    try:
                        (base / n).rmdir()
                    except OSError:
                        pass
