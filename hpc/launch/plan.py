"""The launch plan: which roles run where, with what, and what happens when one exits.

Typed and validated in one place. Every executor (sbatch het job, submitit,
local processes) renders from a Plan, so a bad plan fails here, before
anything is submitted, with the path of the field that is wrong.
"""

from __future__ import annotations

import math
import re
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hpc.validation import problems

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class PlanError(ValueError):
    """A plan that cannot run; the message names each wrong field."""


class RestartPolicy(str, Enum):
    FAIL_RUN = "fail-run"   # any exit of this role ends the run (the trainer)
    RESTART = "restart"     # start it again, up to max_restarts times (pool, inference)
    IGNORE = "ignore"       # let it go; the run goes on (eval)


# A role exits 2 when its config is wrong (the message names the field): starting it again cannot help,
# so no policy restarts it (the driver and the sbatch script end the run instead).
CONFIG_ERROR_EXIT = 2


class Restart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: RestartPolicy
    max_restarts: int = Field(3, ge=0)
    backoff_s: float = Field(2.0, ge=0)
    # A task whose heartbeat (hpc.liveness) is older than this is killed as hung (exit 124) and
    # the policy applies. The role must beat more often; None: only the process is watched.
    liveness_s: float | None = Field(None, ge=1)


class Partition(BaseModel):
    """What one node of a partition offers (nodes of a partition are alike)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: list[str] = Field(min_length=1)
    cpus_per_node: int = Field(ge=1)
    mem_mb: int = Field(ge=1)
    gpus_per_node: int = Field(0, ge=0)


class Role(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    command: list[str] = Field(min_length=1)
    partition: str
    tasks: int = Field(1, ge=1)
    nodes: int = Field(1, ge=1)
    cpus_per_task: int = Field(1, ge=1)
    mem_per_task_mb: int = Field(1024, ge=1)
    gpus_per_task: int = Field(0, ge=0)
    env: dict[str, str] = {}
    restart: Restart
    # One srun step for all tasks with RANK/WORLD_SIZE/MASTER_* set (trainer ranks),
    # restarted as a whole; otherwise one step per task, each restarted alone.
    distributed: bool = False

    @property
    def tasks_per_node(self) -> int:
        return math.ceil(self.tasks / self.nodes)

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        bad = [k for k in env if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)]
        if bad:
            raise ValueError(f"not valid environment variable names: {bad}")
        return env


class Component(BaseModel):
    """One het-job component: the roles of one partition, and what each node must offer them.

    Roles of a partition share its nodes when their needs fit on one node
    together; otherwise each role gets nodes of its own, `offsets[role]` being
    the index of its first node among the component's nodes.
    """

    model_config = ConfigDict(frozen=True)

    index: int
    partition: str
    nodes: int
    cpus_per_node: int
    mem_mb_per_node: int
    gpus_per_node: int
    roles: list[str]
    offsets: dict[str, int]


def _need(roles: list[Role]) -> list[tuple[int, int, int]]:
    return [(r.tasks_per_node * r.cpus_per_task, r.tasks_per_node * r.mem_per_task_mb,
             r.tasks_per_node * r.gpus_per_task) for r in roles]


def _fits_on_node(need: tuple[int, int, int], part: Partition) -> bool:
    return all(n <= h for n, h in zip(need, (part.cpus_per_node, part.mem_mb, part.gpus_per_node), strict=True))


def layout_component(index: int, partition: str, names: list[str], roles: list[Role],
                     part: Partition | None) -> Component:
    """Shared nodes if everything fits on one node together, else disjoint nodes per role."""
    needs = _need(roles)
    cpus, mem_mb, gpus = map(sum, zip(*needs, strict=True))
    shared = (cpus, mem_mb, gpus)
    if part is None or _fits_on_node(shared, part) or len(roles) == 1:
        return Component(index=index, partition=partition, nodes=max(r.nodes for r in roles),
                         cpus_per_node=shared[0], mem_mb_per_node=shared[1], gpus_per_node=shared[2],
                         roles=names, offsets=dict.fromkeys(names, 0))
    offsets, nxt = {}, 0
    for name, role in zip(names, roles, strict=True):
        offsets[name], nxt = nxt, nxt + role.nodes
    peak = tuple(map(max, zip(*needs, strict=True)))
    return Component(index=index, partition=partition, nodes=nxt, cpus_per_node=peak[0],
                     mem_mb_per_node=peak[1], gpus_per_node=peak[2], roles=names, offsets=offsets)


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "agentrl"
    time_limit_min: int = Field(60, ge=1)
    # After SIGUSR2 (time limit or preemption near), how long fail-run roles get to checkpoint
    # before the job requeues itself.
    checkpoint_grace_s: float = Field(60.0, ge=0)
    # How long a stopped unit gets after SIGTERM before SIGKILL (every executor).
    stop_grace_s: float = Field(30.0, gt=0)
    # How long before the time limit Slurm sends SIGUSR2 (sbatch --signal=B:USR2@N, submitit's
    # signal delay): the checkpoint and the stop must fit in it (checked below).
    signal_lead_s: int = Field(120, ge=10)
    roles: dict[str, Role] = Field(min_length=1)
    partitions: dict[str, Partition] = Field(min_length=1)

    @model_validator(mode="after")
    def _fits(self) -> Plan:
        errors = []
        if self.checkpoint_grace_s + self.stop_grace_s >= self.signal_lead_s:
            errors.append(f"checkpoint_grace_s: {self.checkpoint_grace_s:g} s to checkpoint and stop_grace_s "
                          f"{self.stop_grace_s:g} s to stop must fit in signal_lead_s {self.signal_lead_s} s, the "
                          "warning Slurm gives before the time limit: lower them or raise signal_lead_s")
        if self.signal_lead_s >= self.time_limit_min * 60:
            errors.append(f"signal_lead_s: {self.signal_lead_s} s is not less than time_limit_min "
                          f"{self.time_limit_min} min")
        for name, role in self.roles.items():
            where = f"roles.{name}"
            if not _NAME.match(name):
                errors.append(f"{where}: role names are lowercase letters, digits and _ (at most 32)")
            part = self.partitions.get(role.partition)
            if part is None:
                errors.append(f"{where}.partition: unknown partition {role.partition!r} "
                              f"(known: {', '.join(sorted(self.partitions))})")
                continue
            if role.gpus_per_task and not part.gpus_per_node:
                errors.append(f"{where}.gpus_per_task: partition {role.partition!r} has no GPUs; "
                              "use a GPU partition or set gpus_per_task: 0")
            if role.nodes > len(part.nodes):
                errors.append(f"{where}.nodes: {role.nodes} nodes asked, partition {role.partition!r} "
                              f"has {len(part.nodes)}")
            if role.tasks < role.nodes:
                errors.append(f"{where}.tasks: {role.tasks} tasks cannot fill {role.nodes} nodes")
        if not errors:
            errors += self._per_node_fit()
        if errors:
            raise ValueError("\n".join(errors))
        return self

    def _per_node_fit(self) -> list[str]:
        errors = []
        for comp in self.components():
            part = self.partitions[comp.partition]
            roles = "+".join(comp.roles)
            if comp.nodes > len(part.nodes):
                errors.append(f"roles.{roles}: together they do not fit on one node of partition "
                              f"{comp.partition!r}, and apart they need {comp.nodes} nodes; it has "
                              f"{len(part.nodes)}")
            for what, need, have in [("CPUs", comp.cpus_per_node, part.cpus_per_node),
                                     ("MB of memory", comp.mem_mb_per_node, part.mem_mb),
                                     ("GPUs", comp.gpus_per_node, part.gpus_per_node)]:
                if need > have:
                    errors.append(f"roles.{roles}: need {need} {what} per node of partition "
                                  f"{comp.partition!r}, which has {have}; use fewer tasks per node or more nodes")
        return errors

    def components(self) -> list[Component]:
        """Roles grouped by partition, in the order of first appearance."""
        by_part: dict[str, list[str]] = {}
        for name, role in self.roles.items():
            by_part.setdefault(role.partition, []).append(name)
        return [layout_component(i, part, names, [self.roles[n] for n in names], self.partitions.get(part))
                for i, (part, names) in enumerate(by_part.items())]

    def component_of(self, role: str) -> Component:
        return next(c for c in self.components() if role in c.roles)


def load_plan(launch: object, partitions: dict[str, Any] | None = None) -> Plan:
    """A Plan from the `launch:` section of a run config (as parsed: anything but a mapping is refused).

    `partitions`, when the config has none, comes from the cluster (hpc.launch.slurminfo).
    """
    if not isinstance(launch, dict):
        raise PlanError(f"launch: expected a mapping, got {type(launch).__name__}")
    data = dict(launch)
    if "partitions" not in data and partitions is not None:
        data["partitions"] = partitions
    try:
        return Plan.model_validate(data)
    except ValidationError as e:
        raise PlanError(_explain(e)) from None


def _explain(e: ValidationError) -> str:
    lines = []
    for loc, msg in problems(e, "unknown key (a typo? see docs/launch.md for the keys a plan takes)"):
        for line in msg.splitlines():
            lines.append(f"launch.{line}" if not loc else f"launch.{loc}: {line}")
    return "bad launch plan:\n  " + "\n  ".join(lines)
