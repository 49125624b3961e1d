"""Plans are validated before anything is submitted; scripts render from them and stay up to date."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ci import skip_or_fail

from hpc.launch.plan import PlanError, load_plan
from hpc.launch.sbatch import render_sbatch
from hpc.launch.slurminfo import parse_sinfo
from hpc.launch.steps import units

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from render_slurm_scripts import rendered  # noqa: E402

PARTS = {"gpu": {"nodes": ["g1", "g2"], "cpus_per_node": 8, "mem_mb": 16000, "gpus_per_node": 4},
         "cpu": {"nodes": ["c1", "c2"], "cpus_per_node": 8, "mem_mb": 8000}}


def role(**kw):
    return {"command": ["x"], "partition": "gpu", "restart": {"policy": "restart"}, **kw}


def plan(**roles):
    return load_plan({"roles": roles, "partitions": PARTS})


def test_roles_of_a_partition_share_nodes_when_they_fit_together():
    p = plan(trainer=role(tasks=2, gpus_per_task=1, distributed=True, restart={"policy": "fail-run"}),
             inference=role(gpus_per_task=2), pool=role(partition="cpu", tasks=2, nodes=2, cpus_per_task=3))
    gpu, cpu = p.components()
    assert (gpu.nodes, gpu.gpus_per_node, gpu.cpus_per_node, gpu.offsets) == (1, 4, 3, {"trainer": 0, "inference": 0})
    assert (cpu.nodes, cpu.cpus_per_node, cpu.mem_mb_per_node) == (2, 3, 1024)
    assert [u.key for u in units(p)] == ["trainer", "inference-0", "pool-0", "pool-1"]


def test_roles_that_do_not_fit_together_get_nodes_of_their_own():
    p = plan(trainer=role(tasks=4, gpus_per_task=1), inference=role(tasks=1, gpus_per_task=4))
    (gpu,) = p.components()
    assert (gpu.nodes, gpu.gpus_per_node, gpu.offsets) == (2, 4, {"trainer": 0, "inference": 1})


@pytest.mark.parametrize("roles, field", [
    ({"pool": role(partition="cpu", gpus_per_task=1)}, "launch.roles.pool.gpus_per_task: partition 'cpu' has no GPUs"),
    ({"pool": role(partition="cpu", tasks=3, nodes=3)}, "launch.roles.pool.nodes: 3 nodes asked"),
    ({"pool": role(tasks=1, nodes=2)}, "launch.roles.pool.tasks: 1 tasks cannot fill 2 nodes"),
    ({"pool": role(partition="gpux")}, "launch.roles.pool.partition: unknown partition 'gpux'"),
    ({"pool": role(tasks=3, gpus_per_task=2)}, "need 6 GPUs per node"),
    ({"a": role(tasks=4, gpus_per_task=1), "b": role(tasks=4, gpus_per_task=1), "c": role(gpus_per_task=4)},
     "apart they need 3 nodes"),
    ({"pool": {**role(), "colour": "red"}}, "launch.roles.pool.colour: unknown key"),
    ({"pool": role(restart={"policy": "sometimes"})}, "launch.roles.pool.restart.policy"),
    ({"pool": role(command=[])}, "launch.roles.pool.command"),
    ({"Pool": role()}, "launch.roles.Pool: role names are lowercase"),
    ({"pool": role(env={"BAD-NAME": "1"})}, "not valid environment variable names"),
])
def test_bad_plans_name_the_wrong_field(roles, field):
    with pytest.raises(PlanError) as e:
        plan(**roles)
    assert field in str(e.value)


def test_partitions_from_sinfo_output():
    text = "gpu gpu1 8 16000 gpu:4\nall* gpu1 8 16000 gpu:4\nall* cpu1 8 8000 (null)\ncpu cpu1 8 8000 (null)\n"
    parts = parse_sinfo(text)
    assert parts["gpu"] == {"nodes": ["gpu1"], "cpus_per_node": 8, "mem_mb": 16000, "gpus_per_node": 4}
    assert parts["all"]["nodes"] == ["gpu1", "cpu1"] and parts["all"]["gpus_per_node"] == 0


def test_rendered_script_is_a_het_job_with_no_site_paths():
    p = plan(trainer=role(tasks=2, gpus_per_task=1, distributed=True), pool=role(partition="cpu", tasks=2, nodes=2))
    script = render_sbatch(p)
    assert script.count("#SBATCH hetjob") == 1
    for path in ("/root", "/home", "/work", "/tmp", sys.executable):
        assert path not in script
    assert ":-{" not in script  # a default holding braces would end at the first }
    # Only the header is rendered: the body is the one driver, given the plan the script holds.
    assert f"#SBATCH --signal=B:USR2@{p.signal_lead_s}" in script
    head, _, rest = script.partition("exec \"$PYTHON\" -m hpc.launch.driver \"$RUN_DIR\" <<'PLAN'\n")
    assert rest.endswith("PLAN") and "srun --" not in head and "run_unit" not in head and "trap" not in head
    assert load_plan(yaml.safe_load(rest.removesuffix("PLAN"))) == p


def test_the_signal_lead_must_hold_the_checkpoint_and_the_stop():
    with pytest.raises(PlanError, match="checkpoint_grace_s: 100 s to checkpoint and stop_grace_s 30 s to stop must "
                                        "fit in signal_lead_s 120 s"):
        load_plan({"roles": {"trainer": role()}, "partitions": PARTS, "checkpoint_grace_s": 100})
    assert load_plan({"roles": {"trainer": role()}, "partitions": PARTS, "checkpoint_grace_s": 100,
                      "signal_lead_s": 180}).signal_lead_s == 180
    with pytest.raises(PlanError, match="signal_lead_s: 7200 s is not less than time_limit_min 60 min"):
        load_plan({"roles": {"trainer": role()}, "partitions": PARTS, "signal_lead_s": 7200})


def test_ready_scripts_in_slurm_match_their_configs():
    stale = [str(p.relative_to(ROOT)) for p, text in rendered().items()
             if not p.exists() or p.read_text() != text]
    assert not stale, f"stale scripts {stale}: run `make scripts`"


@pytest.mark.integration
def test_scripts_pass_shellcheck(tmp_path):
    if not shutil.which("shellcheck"):
        skip_or_fail("the shellcheck test", "shellcheck is not installed (make sysdeps installs it)")
    scripts = [*ROOT.glob("slurm/*.sbatch"), ROOT / "hpc/localcluster/cluster.sh", *ROOT.glob("tools/*.sh")]
    r = subprocess.run(["shellcheck", "-S", "warning", *map(str, scripts)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


@pytest.mark.integration
def test_launch_dry_run_prints_the_script_and_submits_nothing(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"launch": {"roles": {"pool": role(partition="cpu")}, "partitions": PARTS}}))
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "launch", str(cfg), "--executor", "sbatch",
                        "--dry-run", "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("#!/bin/bash") and "#SBATCH --partition=cpu" in r.stdout
    assert not (tmp_path / "run").exists()
    cfg.write_text(yaml.safe_dump({"launch": {"roles": {"pool": role(partition="cpu", gpus_per_task=1)},
                                              "partitions": PARTS}}))
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "launch", str(cfg), "--dry-run"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "roles.pool.gpus_per_task" in r.stderr


@pytest.mark.integration
def test_a_dry_run_off_the_cluster_previews_the_plan_and_warns_of_the_paths_only_the_cluster_has(tmp_path):
    """configs/cluster-2node.yaml names /shared/...: a preview lists those as warnings; a launch refuses."""
    cfg = ROOT / "configs/cluster-2node.yaml"
    run_dir = ["--run-dir", str(tmp_path / "run")]
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "launch", str(cfg), "--executor", "sbatch", "--dry-run",
                        *run_dir], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("#!/bin/bash"), r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("agentrl: warning:")]
    assert any("train: model: /shared/models/Qwen3-8B holds no config.json" in w for w in warnings), r.stderr
    assert any("train: prompt_data: " in w for w in warnings), r.stderr
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "launch", str(cfg), "--executor", "sbatch", *run_dir],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "holds no config.json" in r.stderr and "warning" not in r.stderr
    assert not (tmp_path / "run").exists()


def _task(index, code, ended, signal=None, restarts=0):
    from hpc.launch.state import TaskRecord
    return TaskRecord(role="trainer", index=index, state="exited", restarts=restarts, started=0.0,
                      ended=ended, exit_code=code, signal=signal)


def test_a_distributed_unit_ends_with_the_rank_that_failed_not_the_ranks_stopped_for_it():
    from hpc.launch.state import unit_exit_code
    stopped_first = [_task(0, 143, 1.0, "SIGTERM"), _task(1, 3, 2.0)]
    assert unit_exit_code(stopped_first, "trainer", 0, reported=143) == 3
    both_failed = [_task(0, 4, 2.0), _task(1, 3, 1.0)]
    assert unit_exit_code(both_failed, "trainer", 0, reported=4) == 3          # the first in time
    earlier_start = [_task(0, 143, 1.0, "SIGTERM", restarts=1), _task(1, 3, 0.5, restarts=0)]
    assert unit_exit_code(earlier_start, "trainer", 1, reported=143) == 143    # not this start's
    assert unit_exit_code([], "trainer", 0, reported=137) == 137


@pytest.mark.integration
def test_an_sbatch_script_asks_the_records_how_a_distributed_unit_ended(tmp_path):
    from hpc.launch.state import write_task_record
    from hpc.runlayout import RunLayout
    layout = RunLayout.create(tmp_path / "run")
    for rec in [_task(0, 143, 1.0, "SIGTERM"), _task(1, 3, 2.0)]:
        write_task_record(layout, rec)
    out = subprocess.run([sys.executable, "-m", "hpc.launch.state", str(layout.root), "exit-code", "trainer",
                          "0", "143"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "3"
    bad = subprocess.run([sys.executable, "-m", "hpc.launch.state", str(layout.root), "exit-code", "trainer"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "exit-code takes ROLE RESTARTS RC" in bad.stderr


def test_an_sbatch_driver_places_each_component_on_its_het_group_nodes():
    from hpc.environment import AllocationEnv
    from hpc.launch.driver import het_nodes

    p = plan(trainer=role(gpus_per_task=1), pool=role(partition="cpu", tasks=2, nodes=2))
    het = "SLURM_JOB_NODELIST_HET_GROUP_"
    alloc = AllocationEnv.from_environ({"SLURM_JOB_NODELIST": "c[1-2],g1", het + "0": "g1", het + "1": "c[1-2]",
                                        het + "X": ""})
    assert alloc.het_nodelists == {0: "g1", 1: "c[1-2]"}
    assert het_nodes(p, alloc) == {"gpu": ["g1"], "cpu": ["c1", "c2"]}
    one = plan(pool=role(partition="cpu", tasks=2, nodes=2))
    assert het_nodes(one, alloc) == {"cpu": ["c1", "c2", "g1"]}     # not a het job: the job's nodes


def test_a_role_command_named_like_a_script_of_the_launchers_python_runs_that_script(tmp_path, monkeypatch):
    """hpc knows no application by name: `agentrl` in a plan is the agentrl installed with the launcher's
    Python, found beside it (its venv's bin/), whether or not that is on PATH."""
    from hpc.launch.task import own_script

    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, mode in (("python", 0o755), ("some-role-tool", 0o755), ("not-executable", 0o644)):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(mode)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    assert own_script("some-role-tool") == str(bin_dir / "some-role-tool")
    assert own_script("not-executable") is None and own_script("no-such-tool-anywhere") is None
    assert own_script(str(bin_dir / "some-role-tool")) is None          # a path is run as given
