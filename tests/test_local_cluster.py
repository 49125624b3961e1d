"""The local cluster is a real Slurm: het jobs land on the right nodes, steps get disjoint GPUs."""

import os
import subprocess
import sys
import time

import pytest

from hpc.localcluster import CLUSTER_SCRIPT as CLUSTER
from hpc.localcluster import SHARED_VOLUME, glusterfs

pytestmark = pytest.mark.slurm


FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def wait_job(job_id: str, env: dict, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env,
                             capture_output=True, text=True).stdout
        states = {w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")}
        if states and states <= FINAL_STATES:
            return " ".join(sorted(states))
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], env=env)
    raise AssertionError(f"job {job_id} did not finish in {timeout}s")


HET_SCRIPT = """#!/bin/bash
#SBATCH -p gpu -N1 -n2 -c1 --mem=1000 --gres=gpu:4
#SBATCH hetjob
#SBATCH -p cpu -N2 -n2 -c1 --mem=500
step() {{
  echo "$1 $SLURMD_NODENAME ${{CUDA_VISIBLE_DEVICES:-none}} $(date +%s.%N)"; sleep 2; echo "$1 end $(date +%s.%N)"
}}
export -f step
srun --het-group=0 -n1 --exact --mem=400 --gres=gpu:2 bash -c 'step trainer' > {out}/trainer &
srun --het-group=0 -n1 --exact --mem=400 --gres=gpu:2 bash -c 'step inference' > {out}/inference &
srun --het-group=1 bash -c 'echo "pool $SLURMD_NODENAME"' > {out}/pool &
wait
"""


def test_het_job_places_components_and_gives_steps_disjoint_gpus(slurm_env, tmp_path):
    script = tmp_path / "het.sbatch"
    script.write_text(HET_SCRIPT.format(out=tmp_path))
    job = subprocess.run(["sbatch", "--parsable", "-o", str(tmp_path / "job.out"), str(script)],
                         env=slurm_env, capture_output=True, text=True, check=True).stdout.strip()
    assert wait_job(job.split(";")[0], slurm_env) == "COMPLETED", (tmp_path / "job.out").read_text()

    gpu_steps = {}
    for role in ("trainer", "inference"):
        start, end = (tmp_path / role).read_text().split("\n")[:2]
        _, node, gpus, t0 = start.split()
        gpu_steps[role] = (node, set(gpus.split(",")), float(t0), float(end.split()[2]))
    assert {s[0] for s in gpu_steps.values()} == {"gpu1"}
    t, i = gpu_steps["trainer"], gpu_steps["inference"]
    assert len(t[1]) == len(i[1]) == 2 and not t[1] & i[1], f"GPUs overlap: {t[1]} {i[1]}"
    assert t[2] < i[3] and i[2] < t[3], "the two GPU steps did not run concurrently"
    pool_nodes = sorted(line.split()[1] for line in (tmp_path / "pool").read_text().splitlines())
    assert pool_nodes == ["cpu1", "cpu2"]


def test_up_is_idempotent_and_down_stops_only_its_own_daemons(slurm_env, tmp_path):
    r = subprocess.run(["bash", str(CLUSTER), "up"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "idle" in r.stdout, r.stderr

    # A second cluster beside the first, with its own directory and ports, and a shared filesystem of its own.
    other = {**os.environ, "AGENTRL_CLUSTER_DIR": str(tmp_path / "c2"), "AGENTRL_CLUSTER_PORT": "6917"}
    other.pop("SLURM_CONF", None)
    agentrl_cluster = [sys.executable, "-m", "agentrl.cli", "cluster"]
    try:
        r = subprocess.run([*agentrl_cluster, "up", "--shared"], env=other, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        volume = glusterfs.Volume.load(tmp_path / "c2" / SHARED_VOLUME)
        assert f"shared filesystem: {volume.clients[0]} on every node" in r.stdout
        pids = [int(p.read_text()) for p in (tmp_path / "c2" / "run").glob("*.pid")]
        assert len(pids) == 8  # munged, slurmctld, three slurmd, each with its own client of the volume
    finally:
        subprocess.run([*agentrl_cluster, "down"], env=other, check=True, timeout=120)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not os.path.ismount(volume.clients[0])
    assert volume.name not in subprocess.run(["pgrep", "-af", "gluster"], capture_output=True, text=True).stdout
    r = subprocess.run([*agentrl_cluster, "down", "--shared"], env=other, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--shared goes with up, not down" in r.stderr
    nodes = subprocess.run(["sinfo", "-h", "-N", "-p", "all", "-o", "%N %T"], env=slurm_env,
                           capture_output=True, text=True, check=True).stdout
    # The first cluster's every node still answers (another test's job may hold one: mixed or allocated);
    # one whose slurmd went with the second cluster's would be down, or marked * (not responding).
    states = dict(line.split() for line in nodes.splitlines())
    assert sorted(states) == ["cpu1", "cpu2", "gpu1"]
    assert set(states.values()) <= {"idle", "mixed", "allocated", "completing"}, states


def test_up_reports_what_failed_with_the_log_path(tmp_path):
    # A broken munge key: `up` stops at the daemon that failed and names its log.
    env = {**os.environ, "AGENTRL_CLUSTER_DIR": str(tmp_path / "bad"), "AGENTRL_CLUSTER_PORT": "6950",
           "AGENTRL_CLUSTER_TIMEOUT": "3"}
    (tmp_path / "bad" / "munge").mkdir(parents=True)
    (tmp_path / "bad" / "munge" / "munge.key").write_text("short")  # munged refuses a key this small
    env.pop("SLURM_CONF", None)
    try:
        r = subprocess.run(["bash", str(CLUSTER), "up"], env=env, capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["bash", str(CLUSTER), "down"], env=env, timeout=60)
    assert r.returncode != 0
    assert "munged did not start" in r.stderr and str(tmp_path / "bad" / "log") in r.stderr


def test_the_nodes_share_a_filesystem_each_through_a_client_of_its_own(slurm_env, cluster_shared):
    """`agentrl cluster up --shared`: in every node's jobs the shared path is a GlusterFS mount of the node's
    own (a mount namespace per slurmd), not this machine's; what one node writes the others read."""
    mount_point = cluster_shared.parent
    probe = (f"echo $SLURMD_NODENAME $(readlink /proc/self/ns/mnt) "
             f"$(awk '$5 == \"{mount_point}\" {{for (i = 7; $i != \"-\"; i++); print $3 \"|\" $(i + 1)}}' "
             f"/proc/self/mountinfo); "
             f"echo written on $SLURMD_NODENAME > {cluster_shared}/from-$SLURMD_NODENAME")
    out = subprocess.run(["srun", "-N3", "-w", "gpu1,cpu1,cpu2", "--time=1", "bash", "-c", probe], env=slurm_env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    seen = {node: rest for node, *rest in (line.split() for line in out.splitlines())}
    assert sorted(seen) == ["cpu1", "cpu2", "gpu1"], out
    namespaces = {ns for ns, *_ in seen.values()}
    assert len(namespaces) == 3 and os.readlink("/proc/self/ns/mnt") not in namespaces, out
    mounts = [mount for _, *mount in seen.values()]         # one mount at the path each, the host's gone
    assert all(len(m) == 1 and m[0].endswith("|fuse.glusterfs") for m in mounts), out
    here = f"{os.major(os.stat(mount_point).st_dev)}:{os.minor(os.stat(mount_point).st_dev)}"
    assert len({m[0] for m in mounts} | {f"{here}|fuse.glusterfs"}) == 4, (here, out)   # four clients
    assert sorted(p.name for p in cluster_shared.iterdir()) == ["from-cpu1", "from-cpu2", "from-gpu1"]
    read = subprocess.run(["srun", "-w", "gpu1", "--time=1", "cat", f"{cluster_shared}/from-cpu1"], env=slurm_env,
                          capture_output=True, text=True, timeout=120, check=True).stdout
    assert read == "written on cpu1\n"
