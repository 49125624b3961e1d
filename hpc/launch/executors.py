"""Submit a plan: as an sbatch het job, through submitit, or as local processes."""

from __future__ import annotations

import sys
import time
from typing import Literal

from .. import slurm
from ..runlayout import RunLayout
from .driver import AllocationDriver, Driver
from .plan import Plan
from .sbatch import render_sbatch
from .state import LaunchRecord, write_launch_record

Executor = Literal["sbatch", "submitit", "local"]


def _save_plan(layout: RunLayout, plan: Plan) -> None:
    """Write the plan a launch runs, and forget how an earlier launch of this run ended."""
    from ..fsio import write_atomic
    layout.launch_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(layout.plan_path, plan.model_dump_json(indent=1).encode())
    layout.end_path.unlink(missing_ok=True)


def submit_sbatch(plan: Plan, layout: RunLayout, python: str, source: str = "") -> str:
    script = layout.sbatch_script_path
    _save_plan(layout, plan)
    script.write_text(render_sbatch(plan, source=source))
    env_args = [f"--export=ALL,AGENTRL_RUN_DIR={layout.root},AGENTRL_PYTHON={python}"]
    job_id = slurm.sbatch(script, *env_args, f"--output={layout.logs_dir}/job-%j.out")
    write_launch_record(layout, LaunchRecord(executor="sbatch", state="submitted", job_id=job_id,
                                             updated=time.time()))
    return job_id


def submitit_jobs(plan: Plan) -> list[Plan]:
    """One allocation per partition of the plan (submitit has no het jobs).

    Slurm also refuses one allocation that mixes GPU and CPU nodes with GPUs
    ("--gpus < -N"), so the pool gets its own job, bound to the others only
    through the run directory: the jobs may start at different times.
    """
    out = []
    for comp in plan.components():
        roles = {n: plan.roles[n] for n in comp.roles}
        out.append(plan.model_copy(update={"roles": roles, "name": f"{plan.name}-{comp.partition}"}))
    return out


def allocation_request(plan: Plan) -> dict:
    """submitit parameters for the allocation of a one-partition plan."""
    (comp,) = plan.components()
    return dict(slurm_partition=comp.partition, nodes=comp.nodes, tasks_per_node=1,
                cpus_per_task=comp.cpus_per_node, slurm_mem=f"{comp.mem_mb_per_node}M",
                slurm_gres=f"gpu:{comp.gpus_per_node}" if comp.gpus_per_node else None,
                timeout_min=plan.time_limit_min, name=plan.name, slurm_signal_delay_s=plan.signal_lead_s,
                # submitit's own srun wrapper hangs the driver's nested srun steps.
                slurm_use_srun=False)


def submit_submitit(plan: Plan, layout: RunLayout, python: str) -> list[str]:
    import submitit

    _save_plan(layout, plan)
    ids = []
    for part in submitit_jobs(plan):
        ex = submitit.AutoExecutor(folder=str(layout.submitit_dir / "%j"), cluster="slurm")
        ex.update_parameters(**allocation_request(part))
        job = ex.submit(AllocationDriver(), part.model_dump_json(), str(layout.root), python)
        ids.append(str(job.job_id))
    write_launch_record(layout, LaunchRecord(executor="submitit", state="submitted", job_id=",".join(ids),
                                             updated=time.time()))
    return ids


def run_local(plan: Plan, layout: RunLayout, python: str | None = None) -> int:
    _save_plan(layout, plan)
    return Driver(plan, layout, "local", python or sys.executable).run()

