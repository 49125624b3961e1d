"""The torch.distributed bootstrap: pure parsing, then real all-reduces under srun and mpirun."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ci import skip_or_fail

from hpc.launch import distenv
from hpc.launch.distenv import (
    DistEnv,
    detect,
    expand_hostlist,
    first_step_node,
    from_slurm,
    master_port,
    node_rank_of,
    parse_tasks_per_node,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "dist_allreduce.py")


@pytest.mark.parametrize("hostlist, hosts", [
    ("gpu1", ["gpu1"]),
    ("cpu[1-2]", ["cpu1", "cpu2"]),
    ("node[01-03,7],login", ["node01", "node02", "node03", "node7", "login"]),
    ("node[08-10]", ["node08", "node09", "node10"]),
    ("rack1-node[1-3]", ["rack1-node1", "rack1-node2", "rack1-node3"]),
    ("cpu[1-2],gpu1", ["cpu1", "cpu2", "gpu1"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
])
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("bad", ["", "a,,b", "node[1-", "node1]", "node[a-b]", "node[3-1]", "node[]",
                                 "node[1-2-3]", "node[[1]]", "a, b"])
def test_expand_hostlist_refuses_malformed(bad):
    with pytest.raises(ValueError, match="malformed hostlist"):
        expand_hostlist(bad)


def test_parse_tasks_per_node():
    assert parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert parse_tasks_per_node("4") == [4]
    assert parse_tasks_per_node("1(x2),3(x1)") == [1, 1, 3]
    for bad in ("", "2(x)", "two", "2(3)"):
        with pytest.raises(ValueError, match="malformed tasks-per-node"):
            parse_tasks_per_node(bad)


def test_master_port_is_deterministic_and_in_range():
    assert master_port("123", "4") == master_port(123, 4)
    assert all(20000 <= master_port(j, s) < 32000 for j in (0, 1, 39999, 10**9) for s in (0, 999, None))
    with pytest.raises(ValueError):
        master_port(-1, 0)
    with pytest.raises(ValueError):
        master_port(1, "batch")


@pytest.mark.parametrize("job", [0, 1, 39, 39999, 40000, 123456789])
def test_master_port_steps_of_one_job_never_collide(job):
    ports = [master_port(job, s) for s in range(1000)] + [master_port(job, None)]
    assert len(set(ports)) == len(ports)


def test_master_port_nearby_jobs_keep_their_first_steps_apart():
    # What the formula's comment promises: jobs < 107 ids apart, steps 0..99.
    for base in (0, 4242, 987654):
        ports = [master_port(base + d, s) for d in range(107) for s in range(100)]
        assert len(set(ports)) == len(ports)


STEP = {  # task 5 of 7 in step 3 of job 77, on the 4th of 4 nodes
    "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3", "SLURM_PROCID": "6", "SLURM_LOCALID": "0",
    "SLURM_NODEID": "3", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "7",
    "SLURM_TASKS_PER_NODE": "4(x4)", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
    "SLURM_JOB_NODELIST": "login,node[01-04]", "SLURM_STEP_NODELIST": "node[02-04,07]",
}


def fake_resolve(name):
    return {"node02": "10.0.0.2", "login": "10.0.0.100", "gpu1": "10.0.1.1"}[name]


def test_from_slurm_reads_the_step():
    env = from_slurm(STEP, resolve=fake_resolve)
    assert env == DistEnv(rank=6, world_size=7, local_rank=0, local_world_size=1,
                          master_addr="10.0.0.2", master_port=master_port(77, 3), node_rank=3)
    assert env.to_environ() == {"RANK": "6", "WORLD_SIZE": "7", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                                "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": str(master_port(77, 3)),
                                "NODE_RANK": "3"}
    # Without the step's own variables, the job's apply.
    job_level = {k: v for k, v in STEP.items() if not k.startswith("SLURM_STEP_") or k == "SLURM_STEP_ID"}
    env = from_slurm(job_level, resolve=fake_resolve)
    assert (env.world_size, env.local_world_size, env.master_addr) == (16, 4, "10.0.0.100")


def test_het_step_master_is_on_the_first_group():
    # Captured from an `srun --het-group=0,1` step on the local cluster: sorted list, group order ids.
    het = {**STEP, "SLURM_STEP_NODELIST": "cpu[1-2],gpu1", "SLURM_JOB_NODELIST_HET_GROUP_0": "gpu1",
           "SLURM_JOB_NODELIST_HET_GROUP_1": "cpu[1-2]"}
    assert first_step_node(het) == "gpu1"
    assert from_slurm(het, resolve=fake_resolve).master_addr == "10.0.1.1"
    # A step of group 1 alone still inherits group 0's variables from the batch script.
    assert first_step_node({**het, "SLURM_STEP_NODELIST": "cpu[1-2]"}) == "cpu1"


def test_explicit_master_wins_and_skips_resolution():
    def no_resolve(name):
        raise AssertionError(f"resolved {name} although MASTER_ADDR was given")
    env = from_slurm({**STEP, "MASTER_ADDR": "ib0.node02", "MASTER_PORT": "29500"}, resolve=no_resolve)
    assert (env.master_addr, env.master_port, env.rank) == ("ib0.node02", 29500, 6)


def test_outside_a_step_names_the_missing_variable():
    batch = {k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"}  # an sbatch script, no srun
    with pytest.raises(ValueError, match=r"SLURM_STEP_ID is not set: this process is not inside an srun step"):
        from_slurm(batch, resolve=fake_resolve)
    with pytest.raises(ValueError, match=r"SLURM_PROCID is not set.*srun step"):
        from_slurm({}, resolve=fake_resolve)
    with pytest.raises(ValueError, match=r"SLURM_PROCID=7 is not below the step's 7 tasks"):
        from_slurm({**STEP, "SLURM_PROCID": "7"}, resolve=fake_resolve)


def test_node_rank_orders_nodes_by_their_first_rank():
    leaders = [0, 0, 2, 2, 4]  # the world rank of each rank's node leader
    assert [node_rank_of(leaders, x) for x in leaders] == [0, 0, 1, 1, 2]


def test_detect_picks_the_innermost_launcher(monkeypatch):
    monkeypatch.setattr(distenv, "from_mpi", lambda environ=None: "mpi")
    monkeypatch.setattr(distenv, "from_slurm", lambda environ: "slurm")
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    assert detect({}) is None
    assert detect(STEP) == "slurm"
    assert detect({"PMIX_RANK": "0"}) == "mpi"
    assert detect({**STEP, "OMPI_COMM_WORLD_SIZE": "2"}) == "mpi"  # mpirun inside an allocation
    assert detect(torchrun) == DistEnv(1, 2, 1, 2, "h", 29500, 0)
    assert detect({**STEP, **torchrun, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1",
                   "TORCHELASTIC_RUN_ID": "x"}) == DistEnv(1, 2, 0, 1, "h", 29500, 1)


def test_from_mpi_without_mpi4py_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ImportError, match=r"pip install 'agentrl-hpc\[mpi\]'.*site's MPI"):
        distenv.from_mpi()


def test_init_process_group_without_a_launcher_refuses():
    with pytest.raises(RuntimeError, match="no launcher found"):
        distenv.init_process_group(environ={})


def allreduce_results(stdout: str) -> dict[int, tuple[int, str]]:
    """rank -> (world_size, sum) as printed by tests/dist_allreduce.py."""
    # Not line by line: mpirun's output forwarding can glue two ranks' lines together (seen here).
    found = re.findall(r"rank=(\d+) world_size=(\d+) .*? sum=([\d.]+)", stdout)
    return {int(r): (int(w), s) for r, w, s in found}


@pytest.mark.slurm
@pytest.mark.parametrize("where", [["-p", "gpu", "-N1"], ["-p", "cpu", "-N2"]], ids=["one-node", "two-nodes"])
def test_allreduce_under_srun(slurm_env, where):
    r = subprocess.run(["srun", *where, "-n2", "--exact", "-c1", "--mem=200", sys.executable, SCRIPT],
                       cwd=ROOT, env=slurm_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert allreduce_results(r.stdout) == {0: (2, "3"), 1: (2, "3")}, r.stdout + r.stderr
    if where[-1] == "-N2":
        assert "node_rank=1" in r.stdout and "local_world_size=1" in r.stdout


@pytest.mark.slurm
def test_resolve_node_addr_falls_back_to_scontrol(slurm_env):
    # The local cluster's node names are not in DNS; slurm.conf gives them NodeAddr=127.0.0.1.
    assert distenv.resolve_node_addr("cpu1") == "127.0.0.1"


@pytest.fixture
def mpirun() -> str:
    """mpirun with mpi4py. Skips (locally) or fails (under CI) when either is missing."""
    problem = None
    if shutil.which("mpirun") is None:
        problem = "mpirun is missing: apt-get install openmpi-bin libopenmpi-dev (make sysdeps)"
    elif importlib.util.find_spec("mpi4py") is None:
        problem = "mpi4py is missing: .venv/bin/pip install 'agentrl-hpc[mpi]'"
    if problem:
        skip_or_fail("the MPI test", problem)
    return shutil.which("mpirun")


@pytest.mark.integration
def test_allreduce_under_mpirun(mpirun):
    # Open MPI refuses to start as root (CI containers) without both variables.
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    r = subprocess.run([mpirun, "-np", "2", "--oversubscribe", sys.executable, SCRIPT, "--mpi"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert allreduce_results(r.stdout) == {0: (2, "3"), 1: (2, "3")}, r.stdout + r.stderr
    assert r.stdout.count("local_world_size=2 node_rank=0") == 2
