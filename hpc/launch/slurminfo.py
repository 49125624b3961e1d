"""What the cluster offers, asked of Slurm: sinfo's lines (hpc.slurm) read into partitions."""

from __future__ import annotations

from ..slurm import SlurmUnavailable, node_lines

__all__ = ["SlurmUnavailable", "parse_sinfo", "partitions_from_sinfo"]


def parse_sinfo(text: str) -> dict[str, dict]:
    """Partitions from `sinfo -h -N -o "%P %N %c %m %G"`: nodes, and the smallest node's resources."""
    parts: dict[str, dict] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        part, node, cpus, mem, gres = line.split()[:5]
        part = part.rstrip("*")
        gpus = 0
        for g in gres.split(","):
            bits = g.split("(")[0].split(":")
            if bits[0] == "gpu" and bits[-1].isdigit():
                gpus = int(bits[-1])
        p = parts.setdefault(part, {"nodes": [], "cpus_per_node": int(cpus), "mem_mb": int(mem),
                                    "gpus_per_node": gpus})
        if node not in p["nodes"]:
            p["nodes"].append(node)
        p["cpus_per_node"] = min(p["cpus_per_node"], int(cpus))
        p["mem_mb"] = min(p["mem_mb"], int(mem))
        p["gpus_per_node"] = min(p["gpus_per_node"], gpus)
    return parts


def partitions_from_sinfo() -> dict[str, dict]:
    return parse_sinfo(node_lines())
