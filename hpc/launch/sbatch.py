"""Render a plan as a self-contained heterogeneous sbatch script that people read, edit and submit.

One het component per partition of the plan. Only the #SBATCH header is rendered from the plan; the
body hands the plan (in the script, as YAML: edit it there) to the same driver that runs submitit
jobs and local runs (`python -m hpc.launch.driver`), which starts each unit as an
`srun --het-group=K` step and applies its restart policy, SIGUSR2 -> checkpoint -> requeue
included. Nothing user- or site-specific is baked in: the run directory and the Python come from
the environment and are printed before anything starts.
"""

from __future__ import annotations

import yaml

from .plan import Plan

_BODY = r'''set -euo pipefail

RUN_DIR=${AGENTRL_RUN_DIR:?set AGENTRL_RUN_DIR to the run directory on the shared filesystem}
PYTHON=${AGENTRL_PYTHON:-python3}
# The driver (hpc/launch/driver.py) runs the plan below: every role as srun steps, restarts, the
# checkpoint and requeue after SIGUSR2, and the record of how the run ended (agentrl status).
exec "$PYTHON" -m hpc.launch.driver "$RUN_DIR" <<'PLAN'
'''


def render_sbatch(plan: Plan, *, source: str = "") -> str:
    lines = ["#!/bin/bash",
             f"# agentrl-hpc: heterogeneous job for plan {plan.name!r}{f' ({source})' if source else ''}.",
             "# Rendered by `agentrl launch CONFIG --executor sbatch --dry-run`; edit freely.",
             "# Needs: AGENTRL_RUN_DIR (the run directory, on the shared filesystem);",
             "#        AGENTRL_PYTHON (default python3: the interpreter with agentrl-hpc installed).",
             f"#SBATCH --job-name={plan.name}",
             f"#SBATCH --time={plan.time_limit_min}",
             f"#SBATCH --signal=B:USR2@{plan.signal_lead_s}",
             "#SBATCH --requeue"]
    for c in plan.components():
        if c.index:
            lines.append("#SBATCH hetjob")
        gres = f" --gres=gpu:{c.gpus_per_node}" if c.gpus_per_node else ""
        lines.append(f"#SBATCH --partition={c.partition} --nodes={c.nodes} --ntasks-per-node=1 "
                     f"--cpus-per-task={c.cpus_per_node} --mem={c.mem_mb_per_node}M{gres}")
    body = yaml.safe_dump(plan.model_dump(mode="json"), sort_keys=False, width=120)
    return "\n".join(lines) + "\n" + _BODY + body + "PLAN"
