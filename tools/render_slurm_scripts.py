"""Render slurm/<config>.sbatch from every configs/cluster-*.yaml (`make scripts`).

The scripts in slurm/ are what users read and submit by hand; a test checks they
match what the code renders now.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hpc.launch.plan import load_plan
from hpc.launch.sbatch import render_sbatch
from hpc.validation import read_yaml_file

ROOT = Path(__file__).resolve().parents[1]


def rendered() -> dict[Path, str]:
    out = {}
    for cfg in sorted((ROOT / "configs").glob("cluster-*.yaml")):
        plan = load_plan(read_yaml_file(cfg)["launch"])
        out[ROOT / "slurm" / f"{cfg.stem}.sbatch"] = render_sbatch(plan, source=f"configs/{cfg.name}") + "\n"
    return out


def main() -> int:
    for path, text in rendered().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
