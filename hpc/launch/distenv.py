"""torch.distributed bootstrap: RANK, WORLD_SIZE, MASTER_ADDR... from an srun step, mpirun or torchrun.

The parsing is pure (the environment is passed in); the I/O is in three thin shells:
`resolve_node_addr` (DNS, then scontrol), `from_mpi` (mpi4py) and `init_process_group` (torch).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from itertools import product

from .. import slurm

# [20000, 32000): below Linux's ephemeral ports (32768 and up), which any socket may be holding.
PORT_BASE, PORT_RANGE, JOB_STRIDE = 20000, 12000, 1009  # see master_port


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    node_rank: int

    def to_environ(self) -> dict[str, str]:
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(self.local_rank), "LOCAL_WORLD_SIZE": str(self.local_world_size),
                "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
                "NODE_RANK": str(self.node_rank)}


# One host pattern: text and bracketed ranges, as in rack1-node[01-03,7]. A comma inside
# brackets separates ranges, outside them hosts, so the list is matched, not split.
_HOST = r"(?:[^\[\],\s]|\[[^\[\]]*\])+"


def _expand_range(body: str, whole: str) -> list[str]:
    out = []
    for item in body.split(","):
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"malformed hostlist {whole!r}: bad range {item!r} in [{body}]")
        hi = hi if sep else lo
        if int(hi) < int(lo):
            raise ValueError(f"malformed hostlist {whole!r}: range {item!r} runs backwards")
        # Slurm pads to the width of the low bound: node[08-10] -> node08, node09, node10.
        out += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
    return out


def expand_hostlist(s: str) -> list[str]:
    """Expand a Slurm hostlist ("node[01-03,7],login") into host names, in order."""
    if not re.fullmatch(rf"{_HOST}(?:,{_HOST})*", s.strip()):
        raise ValueError(f"malformed hostlist {s!r}: expected names like node[01-03,7] joined by commas")
    hosts = []
    for part in re.findall(_HOST, s.strip()):
        # Alternating literal text and bracket bodies; several brackets multiply out like Slurm's.
        pieces = re.split(r"\[([^\]]*)\]", part)
        choices = [[p] if i % 2 == 0 else _expand_range(p, s) for i, p in enumerate(pieces)]
        hosts += ["".join(c) for c in product(*choices)]
    return hosts


def parse_tasks_per_node(s: str) -> list[int]:
    """Expand Slurm's tasks-per-node ("2(x3),1") into one count per node ([2, 2, 2, 1])."""
    counts = []
    for item in s.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not m:
            raise ValueError(f"malformed tasks-per-node {s!r}: expected items like '2' or '2(x3)'")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def master_port(job_id: str | int, step_id: str | int | None) -> int:
    """A port every task of one step computes alike, without talking to the others."""
    job = int(job_id)
    # No step (a batch script, salloc shell): one past the steps we promise to keep apart.
    step = 1000 if step_id is None else int(step_id)
    if job < 0 or step < 0:
        raise ValueError(f"job id and step id must be >= 0, got {job_id!r}, {step_id!r}")
    # The step is added, not hashed: steps 0..999 of one job get 1000 distinct ports, so the
    # concurrent steps of one allocation (trainer, inference, eval) cannot collide. The job id
    # is multiplied by a prime stride instead of taken modulo the range: jobs that share a node
    # at the same time have nearby ids, and with stride 1009 any two jobs < 107 ids apart start
    # >= 100 ports apart, so their steps 0..99 never collide (tested); farther jobs rarely do.
    return PORT_BASE + (job * JOB_STRIDE + step) % PORT_RANGE


_NOT_IN_STEP = ("this process is not inside an srun step "
                "(run it with srun, or export RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")


def _need(environ: Mapping[str, str], *names: str, why: str = _NOT_IN_STEP) -> str:
    """The first of `names` that is set; else a ValueError naming what is missing."""
    for name in names:
        if environ.get(name, "") != "":
            return environ[name]
    raise ValueError(f"{' or '.join(names)} is not set: {why}")


def _int(environ: Mapping[str, str], *names: str, why: str = _NOT_IN_STEP) -> int:
    value = _need(environ, *names, why=why)
    if not value.isdigit():
        raise ValueError(f"{names[0]}={value!r} is not a non-negative integer")
    return int(value)


def resolve_node_addr(name: str) -> str:
    """The address of Slurm node `name`: DNS first, then the NodeAddr that slurmctld knows."""
    # DNS first: every rank resolves the master, and thousands of scontrol calls at once would
    # load slurmctld. scontrol covers nodes whose names do not resolve (NodeAddr differs).
    try:
        return socket.gethostbyname(name)
    except OSError:
        pass
    return slurm.node_address(name)


def first_step_node(environ: Mapping[str, str]) -> str:
    """The node of task 0: the step's first node, het job groups taken in order."""
    nodes = expand_hostlist(_need(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
    # A step across het groups lists its nodes sorted by name (cpu[1-2],gpu1), but numbers them
    # group by group: task 0 is on the first node of the first group the step uses (tested).
    group, in_step = 0, set(nodes)
    while (key := f"SLURM_JOB_NODELIST_HET_GROUP_{group}") in environ:
        hits = [h for h in expand_hostlist(environ[key]) if h in in_step]
        if hits:
            return hits[0]
        group += 1
    return nodes[0]


def from_slurm(environ: Mapping[str, str], resolve: Callable[[str], str] = resolve_node_addr) -> DistEnv:
    """The DistEnv of a task in an srun step.

    A MASTER_ADDR or MASTER_PORT already in `environ` wins over the derived one: it is how a
    user pins the rendezvous (a firewall-opened port, a specific interface's address).
    """
    rank = _int(environ, "SLURM_PROCID")
    # Inside an allocation a step may run fewer tasks than the job: the step's count comes first.
    world = _int(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    node_rank = _int(environ, "SLURM_NODEID")  # relative to the step's nodes, like the lists below
    per_node = parse_tasks_per_node(_need(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if node_rank >= len(per_node):
        raise ValueError(f"SLURM_NODEID={node_rank} but tasks-per-node {per_node} lists {len(per_node)} nodes")
    if rank >= world:
        raise ValueError(f"SLURM_PROCID={rank} is not below the step's {world} tasks")
    if environ.get("MASTER_PORT"):
        port = _int(environ, "MASTER_PORT")
    else:
        port = master_port(_need(environ, "SLURM_JOB_ID"), _need(environ, "SLURM_STEP_ID"))
    addr = environ.get("MASTER_ADDR") or resolve(first_step_node(environ))
    return DistEnv(rank=rank, world_size=world, local_rank=_int(environ, "SLURM_LOCALID"),
                   local_world_size=per_node[node_rank], master_addr=addr, master_port=port,
                   node_rank=node_rank)


def from_torchrun(environ: Mapping[str, str]) -> DistEnv:
    """The DistEnv that torchrun (or a user) exported. Without LOCAL_* it is one node."""
    why = "torchrun sets it; without torchrun, export RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
    rank, world = _int(environ, "RANK", why=why), _int(environ, "WORLD_SIZE", why=why)
    local_rank = _int(environ, "LOCAL_RANK") if environ.get("LOCAL_RANK") else rank
    local_world = _int(environ, "LOCAL_WORLD_SIZE") if environ.get("LOCAL_WORLD_SIZE") else world
    node = _int(environ, "NODE_RANK", "GROUP_RANK") if environ.get("NODE_RANK") or environ.get("GROUP_RANK") else 0
    return DistEnv(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
                   master_addr=_need(environ, "MASTER_ADDR", why=why),
                   master_port=_int(environ, "MASTER_PORT", why=why), node_rank=node)


def node_rank_of(leaders: list[int], leader: int) -> int:
    """Number the nodes by their lowest world rank, so that node 0 holds rank 0."""
    return sorted(set(leaders)).index(leader)


def free_port(host: str = "") -> int:
    """A TCP port free on `host` now (every one of this machine's addresses by default). Released before
    the caller binds it: another process could take it in between (a fixed MASTER_PORT avoids that)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def from_mpi(comm=None, environ: Mapping[str, str] | None = None) -> DistEnv:
    """The DistEnv of an MPI rank (mpirun, or srun --mpi=pmix). Collective: every rank must call it."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("from_mpi needs mpi4py: pip install 'agentrl-hpc[mpi]', with the site's MPI "
                          "loaded first (e.g. `module load openmpi`) so mpi4py uses that MPI") from e
    env = os.environ if environ is None else environ
    comm = MPI.COMM_WORLD if comm is None else comm
    rank, size = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    # A node is what shares memory, not what shares a hostname (containers can repeat one):
    # each rank names its node by the world rank of the node's first rank.
    leader = local.bcast(rank, root=0)
    node_rank = node_rank_of(comm.allgather(leader), leader)
    local.Free()
    # The hostname, not its local resolution: on Debian it resolves to 127.0.1.1 on its own host.
    addr = env.get("MASTER_ADDR") or comm.bcast(socket.gethostname() if rank == 0 else None, root=0)
    port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else comm.bcast(
        free_port() if rank == 0 else None, root=0)
    return DistEnv(rank=rank, world_size=size, local_rank=local_rank, local_world_size=local_size,
                   master_addr=addr, master_port=port, node_rank=node_rank)


def detect(environ: Mapping[str, str]) -> DistEnv | None:
    """The DistEnv of whichever launcher started this process; None when it runs alone."""
    has = environ.__contains__
    # The innermost launcher wins. torchrun and mpirun run inside srun steps and allocations,
    # and their processes inherit the step's SLURM_PROCID (mpirun's ranks all see 0), so their
    # own markers come before Slurm's.
    if has("TORCHELASTIC_RUN_ID"):
        return from_torchrun(environ)
    if has("OMPI_COMM_WORLD_SIZE"):
        return from_mpi(environ=environ)
    if has("SLURM_STEP_ID") and has("SLURM_PROCID"):
        return from_slurm(environ)
    if has("PMI_SIZE") or has("PMIX_RANK"):
        return from_mpi(environ=environ)
    if all(has(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return from_torchrun(environ)
    return None


def init_process_group(backend: str = "gloo", environ: Mapping[str, str] | None = None,
                       timeout: timedelta = timedelta(minutes=5)) -> DistEnv:
    """Detect the launcher, export its DistEnv to os.environ and initialize torch.distributed."""
    import torch.distributed as dist

    dist_env = detect(os.environ if environ is None else environ)
    if dist_env is None:
        raise RuntimeError("no launcher found: start this under srun, mpirun or torchrun, "
                           "or export RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT")
    # Libraries below torch (NCCL, DeepSpeed, Megatron) read these, not our DistEnv.
    os.environ.update(dist_env.to_environ())
    host = f"[{dist_env.master_addr}]" if ":" in dist_env.master_addr else dist_env.master_addr
    dist.init_process_group(backend, init_method=f"tcp://{host}:{dist_env.master_port}",
                            rank=dist_env.rank, world_size=dist_env.world_size, timeout=timeout)
    return dist_env
