"""Section (c) of benchmarks/sandbox_bench.py: sandboxes per node at Harbor's default limits.

COUNT bwrap sandboxes at once, each with Harbor's defaults (1 CPU, 2 GiB memory, 10 GiB storage),
write WRITE MiB to their work tree and run its tests, on each disk the node supports:
    figure:   storage "disk"  (a sparse ext4 image per sandbox on the scratch disk, hpc.sandbox.storage)
    baseline: storage "tmpfs" (the layers in RAM, as every sandbox had them before)
Per sandbox: the RAM it holds (its cgroup's processes and tmpfs pages, and the proportional
share of its supervisor, bwrap and pid 1) before and after the write, its page cache
(reclaimable), what its disk holds (its filesystem's used blocks) and its start time; for the
node: MemAvailable before and after. "holds" is how many such sandboxes this node's RAM and scratch disk fit, each
bound computed from what one sandbox held: min(MemTotal / RAM held, scratch free / disk taken).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

from benchmarks.common import percentile
from hpc.sandbox.base import SandboxSpec
from hpc.sandbox.bwrap import BwrapSandbox
from hpc.sandbox.policy import Limits

HARBOR_DEFAULTS = Limits(cpus=1.0, memory_mb=2048, storage_mb=10240)
MIB = 1 << 20


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        out[key] = int(rest.split()[0]) * 1024
    return out


def pss(pid: int | None) -> int:
    """A process's proportional set size (its share of pages it shares), bytes; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _fixed(sb: BwrapSandbox) -> int:
    """What a sandbox holds outside its cgroup: its supervisor, bwrap, and pid 1."""
    try:
        bwrap = int(Path(f"/proc/{sb.init_pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        bwrap = None
    return pss(sb.supervisor_pid) + pss(bwrap) + pss(sb.init_pid)


async def _one(spec: SandboxSpec, write_mib: int, written: asyncio.Barrier) -> dict:
    t0 = time.monotonic()
    async with BwrapSandbox(spec) as sb:
        start_s = time.monotonic() - t0
        before = await sb.usage()
        fixed = _fixed(sb)
        r = await sb.exec(f"head -c {write_mib}M /dev/zero > /testbed/blob && python3 -m unittest -q 2>&1",
                          timeout_s=600)
        after = await sb.usage()
        await written.wait()        # every sandbox holds what it wrote while the node is read
        assert before is not None and after is not None
        return {"ok": r.exit_code == 0, "exit_code": r.exit_code, "backing": sb.storage.get("backing"),
                "start_s": start_s,
                "ram_before": fixed + before.ram, "ram_after": _fixed(sb) + after.ram, "cache_after": after.cache,
                "disk_used": after.disk_size - after.disk_free if after.disk_backing == "disk" else 0,
                "oom_kills": after.oom_kills}


async def _run(mode: str, count: int, write_mib: int, scratch: str, repo: str) -> dict:
    spec = SandboxSpec(workdir_source=repo, scratch_dir=scratch, storage=mode, limits=HARBOR_DEFAULTS)
    node_before = meminfo()["MemAvailable"]
    written = asyncio.Barrier(count + 1)
    tasks = [asyncio.create_task(_one(spec, write_mib, written)) for _ in range(count)]
    while written.n_waiting < count and not any(t.done() for t in tasks):
        await asyncio.sleep(0.05)
    node_after = meminfo()["MemAvailable"]
    if any(t.done() for t in tasks):
        await written.abort()        # one failed: the others stop waiting, and its error is raised below
    else:
        await written.wait()
    rows = await asyncio.gather(*tasks)
    return {"rows": rows, "node_available_drop": node_before - node_after}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def summarize(mode: str, got: dict, count: int, scratch: str) -> dict:
    rows = got["rows"]
    ram_before, ram_after = _mean([r["ram_before"] for r in rows]), _mean([r["ram_after"] for r in rows])
    disk = _mean([r["disk_used"] for r in rows])
    total, free_disk = meminfo()["MemTotal"], shutil.disk_usage(scratch).free
    by_ram = total // max(int(ram_after), 1)
    by_disk = free_disk // int(disk) if disk else None
    return {"mode": mode, "sandboxes": count, "ok": sum(r["ok"] for r in rows),
            "start_p50_s": percentile((r["start_s"] for r in rows), 0.5),
            "backing": sorted({r["backing"] for r in rows}), "oom_kills": sum(r["oom_kills"] for r in rows),
            "ram_before_mib": ram_before / MIB, "ram_after_mib": ram_after / MIB,
            "ram_growth": ram_after / ram_before if ram_before else None,
            "cache_after_mib": _mean([r["cache_after"] for r in rows]) / MIB, "disk_mib": disk / MIB,
            "node_available_drop_mib_per_sandbox": got["node_available_drop"] / count / MIB,
            "holds_by_ram": by_ram, "holds_by_disk": by_disk,
            "holds": min(by_ram, by_disk) if by_disk is not None else by_ram}


def measure_density(scratch: str, repo: str, count: int, write_mib: int, log) -> dict:
    """Both modes in one run: the figure (disk) and the baseline (tmpfs), and their ratio."""
    out: dict = {"count": count, "write_mib": write_mib, "limits": {"cpus": HARBOR_DEFAULTS.cpus,
                 "memory_mb": HARBOR_DEFAULTS.memory_mb, "storage_mb": HARBOR_DEFAULTS.storage_mb}}
    os.makedirs(scratch, exist_ok=True)
    for key, mode in (("figure", "disk"), ("baseline", "tmpfs")):
        out[key] = summarize(mode, asyncio.run(_run(mode, count, write_mib, scratch, repo)), count, scratch)
    fig, base = out["figure"], out["baseline"]
    out["ram_ratio"] = fig["ram_after_mib"] / base["ram_after_mib"] if base["ram_after_mib"] else None
    out["holds_ratio"] = fig["holds"] / base["holds"] if base["holds"] else None
    out["target"] = {"max_ram_growth": 1.1}
    out["meets_target"] = bool(fig["ram_growth"] is not None and fig["ram_growth"] <= 1.1
                               and fig["ok"] == count == base["ok"])
    log(f"{'':<10}{'ok':>4}{'RAM held MiB (0 -> W)':>24}{'growth':>8}{'cache MiB':>11}{'disk MiB':>10}"
        f"{'node avail drop':>17}{'holds (RAM, disk)':>20}{'start p50':>11}")
    for side in (fig, base):
        log(f"{side['mode']:<10}{side['ok']:>4}{side['ram_before_mib']:>11.1f} -> {side['ram_after_mib']:>8.1f}"
            f"{side['ram_growth'] or 0:>8.2f}{side['cache_after_mib']:>11.0f}{side['disk_mib']:>10.0f}"
            f"{side['node_available_drop_mib_per_sandbox']:>14.0f} Mi{side['holds']:>8} "
            f"({side['holds_by_ram']}, {side['holds_by_disk'] if side['holds_by_disk'] is not None else '-'})"
            f"{side['start_p50_s']:>10.3f}s")
    log(f"ratio (disk / tmpfs): RAM held per sandbox {out['ram_ratio']:.3f}, sandboxes a node holds "
        f"{out['holds_ratio']:.1f}; target RAM growth at {write_mib} MiB written <= 1.1: "
        f"{'met' if out['meets_target'] else 'NOT met'}")
    return out
