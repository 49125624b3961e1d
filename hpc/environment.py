"""The process's place in the cluster, read from the environment in one place.

Everything else asks `Writer.current()` (who is writing this record), `SlurmEnv.from_environ()`
(this process's Slurm ids), `AllocationEnv.from_environ()` (its job's nodes) or
`RoleEnv.from_environ()` (what the launcher told a role); nothing deeper in the code reads
os.environ for Slurm or the launcher. (hpc.launch.distenv parses the variables of srun, MPI and
torchrun, for torch's bootstrap alone.)
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict


class SlurmEnv(BaseModel):
    """The Slurm ids of this process, None outside a job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str | None = None
    step_id: str | None = None
    proc_id: int | None = None
    node: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SlurmEnv:
        env = os.environ if environ is None else environ
        # A het job component reports its own id as SLURM_JOB_ID; the pack leader's is what users see.
        job = env.get("SLURM_HET_JOB_ID") or env.get("SLURM_JOB_ID")
        proc = env.get("SLURM_PROCID")
        return cls(
            job_id=job,
            step_id=env.get("SLURM_STEP_ID"),
            proc_id=int(proc) if proc and proc.isdigit() else None,
            node=env.get("SLURMD_NODENAME"),
        )


class AllocationEnv(BaseModel):
    """The nodes of this job's allocation (hostlist expressions), for a driver that places steps on them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nodelist: str = ""                          # SLURM_JOB_NODELIST
    het_nodelists: dict[int, str] = {}          # het-job component i: SLURM_JOB_NODELIST_HET_GROUP_<i>

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> AllocationEnv:
        env = os.environ if environ is None else environ
        prefix = "SLURM_JOB_NODELIST_HET_GROUP_"
        het = {int(k[len(prefix):]): v for k, v in env.items() if k.startswith(prefix) and k[len(prefix):].isdigit()}
        return cls(nodelist=env.get("SLURM_JOB_NODELIST", ""), het_nodelists=het)


class Writer(BaseModel):
    """Who wrote a record: every record on the shared filesystem names its writer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    pid: int
    slurm: SlurmEnv = SlurmEnv()

    @classmethod
    def current(cls) -> Writer:
        global _current
        # Cached per pid: a forked child is another writer.
        if _current is None or _current.pid != os.getpid():
            _current = cls(host=socket.gethostname(), pid=os.getpid(), slurm=SlurmEnv.from_environ())
        return _current


_current: Writer | None = None


class RoleEnv(BaseModel):
    """What the launcher tells a role's task (hpc.launch.task): its run directory, role, index and GPUs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_dir: Path | None = None
    role: str | None = None
    task_index: int = 0
    visible_gpus: tuple[str, ...] | None = None    # None: CUDA_VISIBLE_DEVICES is unset, so all of the node's
    heartbeat_file: Path | None = None     # the role's liveness file (hpc.liveness); None: not watched

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> RoleEnv:
        env = os.environ if environ is None else environ
        index = env.get("AGENTRL_TASK_INDEX", "0")
        if not index.isdecimal():
            raise ValueError(f"AGENTRL_TASK_INDEX={index!r} is not a task index")
        gpus = env.get("CUDA_VISIBLE_DEVICES")
        return cls(run_dir=Path(env["AGENTRL_RUN_DIR"]) if env.get("AGENTRL_RUN_DIR") else None,
                   role=env.get("AGENTRL_ROLE") or None, task_index=int(index),
                   visible_gpus=None if gpus is None else tuple(g for g in gpus.split(",") if g.strip()),
                   heartbeat_file=Path(env["AGENTRL_HEARTBEAT_FILE"]) if env.get("AGENTRL_HEARTBEAT_FILE") else None)
