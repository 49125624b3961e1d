"""How one unit of a role is started: the srun command line, or local processes.

A unit is either a whole distributed role (one srun step, every rank) or one
task of any other role (its own step, so that it restarts alone). Pure
functions build the command lines; the sbatch renderer and the driver share them.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .distenv import free_port
from .plan import Plan, RestartPolicy, Role

# Set by sbatch/salloc for the whole allocation; left in a step's environment
# they override what the step asks for (srun then warns, or hands every step the
# same GPUs).
_HET_ALLOCATION_VAR = re.compile(r"^SLURM_(NTASKS_PER_NODE|GPUS_PER_NODE)_(HET|PACK)_GROUP_\d+$")   # one component's
ALLOCATION_VARS = ("SLURM_GPUS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TRES_PER_TASK",
                   "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU", "SLURM_CPUS_PER_TASK", "SLURM_NTASKS",
                   "SLURM_NPROCS", "SLURM_GPUS", "SLURM_GPUS_PER_TASK")


@dataclass(frozen=True)
class Unit:
    role: str
    index: int | None        # None: every task of a distributed role

    @property
    def key(self) -> str:
        return self.role if self.index is None else f"{self.role}-{self.index}"


def units(plan: Plan) -> list[Unit]:
    out = []
    for name, role in plan.roles.items():
        if role.distributed:
            out.append(Unit(name, None))
        else:
            out.extend(Unit(name, i) for i in range(role.tasks))
    return out


def task_command(python: str, run_dir: str, unit: Unit, role: Role, restarts: int | str) -> list[str]:
    cmd = [python, "-m", "hpc.launch.task", "--run", run_dir, "--role", unit.role,
           "--gpus", str(role.gpus_per_task), "--restarts", str(restarts)]
    if unit.index is not None:
        cmd += ["--index", str(unit.index)]
    if role.distributed:
        cmd.append("--dist")
    if role.restart.policy is RestartPolicy.FAIL_RUN:
        cmd.append("--checkpoint-signal")
    if role.restart.liveness_s is not None:
        cmd += ["--liveness-s", f"{role.restart.liveness_s:g}"]
    return [*cmd, "--", *role.command]


def srun_args(unit: Unit, role: Role, *, log_dir: str, het_group: int | None = None,
              nodelist: str | None = None) -> list[str]:
    """srun options for one unit, inside an allocation that holds the role's nodes."""
    tasks, nodes = (role.tasks, role.nodes) if unit.index is None else (1, 1)
    per_node = -(-tasks // nodes)
    args = ["srun", "--exact", f"--job-name={unit.role}", f"--nodes={nodes}", f"--ntasks={tasks}",
            f"--cpus-per-task={role.cpus_per_task}", f"--mem={per_node * role.mem_per_task_mb}M",
            "--open-mode=append"]
    if het_group is not None:
        args.append(f"--het-group={het_group}")
    if nodelist:
        args.append(f"--nodelist={nodelist}")
    if role.gpus_per_task:
        args += [f"--gpus-per-task={role.gpus_per_task}", f"--gpu-bind=single:{role.gpus_per_task}"]
    if unit.index is None:
        args += ["--kill-on-bad-exit=1", f"--output={log_dir}/{unit.role}-%t.log"]
    else:
        args.append(f"--output={log_dir}/{unit.key}.log")
    return args


def step_environment(base: dict[str, str], role: Role) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in ALLOCATION_VARS and not _HET_ALLOCATION_VAR.match(k)}
    env.update(role.env)
    return env


def start_local(unit: Unit, role: Role, *, python: str, run_dir: str, log_dir: Path, restarts: int,
                gpu_ids: list[int]) -> list[subprocess.Popen]:
    """Start a unit as local processes, each in its own session; GPU ids are handed out by the caller."""
    n = role.tasks if unit.index is None else 1
    port = free_port() if unit.index is None else None
    procs = []
    for k in range(n):
        index = k if unit.index is None else unit.index
        env = step_environment(dict(os.environ), role)
        mine = gpu_ids[k * role.gpus_per_task:(k + 1) * role.gpus_per_task]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, mine))
        if port is not None:
            env.update(RANK=str(k), WORLD_SIZE=str(n), LOCAL_RANK=str(k), LOCAL_WORLD_SIZE=str(n),
                       NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        cmd = task_command(python, run_dir, Unit(unit.role, index), role, restarts)
        log = open(log_dir / f"{unit.role}-{index}.log", "ab")
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True))
        log.close()
    return procs


def start_srun(unit: Unit, role: Role, *, python: str, run_dir: str, log_dir: Path, restarts: int,
               nodelist: str | None, het_group: int | None = None) -> list[subprocess.Popen]:
    cmd = srun_args(unit, role, log_dir=str(log_dir), nodelist=nodelist, het_group=het_group)
    cmd += task_command(python, run_dir, unit, role, restarts)
    env = step_environment(dict(os.environ), role)
    return [subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)]
