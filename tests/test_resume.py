"""Issue 15, defect 6: a run stopped mid-way is continued by the same `agentrl launch` command and trains
exactly the rollouts an uninterrupted run would have: the same groups, the same weights at the end.

The trainer is the real one (`agentrl train`, the tiny model); the pool is the stand-in whose samples are a
pure function of (rollout, group, attempt) (tests/roles/fake_pool_role.py), so two runs can agree exactly.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from run_story import what_happened
from waiting import wait_until

from hpc.ledger import Ledger
from hpc.runlayout import RunLayout

pytestmark = pytest.mark.integration

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
ROLLOUTS = 6                       # a stop after the first checkpoint lands mid-way, however fast rollouts go


@pytest.fixture
def prompts(bundled_prompts) -> Path:
    return bundled_prompts


def write_config(path: Path, tiny_model: Path, prompts: Path, *, slurm: bool = False, **train) -> Path:
    roles = {"trainer": {"command": ["agentrl", "train"], "partition": "cpu", "mem_per_task_mb": 2000,
                         "restart": {"policy": "fail-run"}},
             "pool": {"command": [sys.executable, str(ROOT / "tests/roles/fake_pool_role.py")], "partition": "cpu",
                      "mem_per_task_mb": 500, "restart": {"policy": "restart", "max_restarts": 2}}}
    launch = {"name": "resume", "time_limit_min": 10, "roles": roles}
    if not slurm:            # on the local cluster, sinfo says
        launch["partitions"] = {"cpu": {"nodes": ["local"], "cpus_per_node": 4, "mem_mb": 8000}}
    path.write_text(yaml.safe_dump({
        "launch": launch,
        "train": {"model": str(tiny_model), "prompt_data": str(prompts), "num_rollouts": ROLLOUTS,
                  "rollout_batch_size": 2, "n_samples_per_prompt": 2, "lr": 1e-3, "max_tokens_per_gpu": 256,
                  "rollout_timeout_s": 120, "seed": 7, "tracking": {"wandb": "disabled"}, **train}}))
    return path


def launch(config: Path, run_dir: Path, *extra: str, wait: bool = True, executor: str = "local", env=None):
    cmd = [sys.executable, "-m", "agentrl.cli", "launch", str(config), "--executor", executor, "--run-dir",
           str(run_dir), *extra]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def checkpointed(run_dir: Path) -> int:
    return (RunLayout.open(run_dir).latest_checkpoint() or 0) if (run_dir / "run.yaml").exists() else 0


def trained(run_dir: Path) -> dict[int, str]:
    """rollout -> the weights' fingerprint after it (the last time it was trained, if twice)."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["rollout"]: m["fingerprint"] for m in lines if m.get("kind") == "train"}


def groups(run_dir: Path) -> dict[int, list[int]]:
    ledger = Ledger(run_dir / "ledger")
    return {r: ledger.spec(r, ledger.current_generation(r)).groups for r in ledger.rollouts()}


@pytest.mark.slow
def test_a_stopped_run_is_continued_by_the_same_launch_and_ends_as_an_uninterrupted_one(tiny_model, prompts,
                                                                                         tmp_path):
    config = write_config(tmp_path / "run.yaml", tiny_model, prompts)
    straight = tmp_path / "straight"
    r = launch(config, straight)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(trained(straight)) == list(range(ROLLOUTS))

    stopped = tmp_path / "stopped"
    first = launch(config, stopped, wait=False)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if (stopped / "run.yaml").exists() and (RunLayout.open(stopped).latest_checkpoint() or 0) >= 1:
                break
            assert first.poll() is None, first.stdout.read()
            time.sleep(0.2)
        stop = subprocess.run([sys.executable, "-m", "agentrl.cli", "stop", str(stopped)], capture_output=True,
                              text=True, timeout=60, cwd=ROOT)
        assert stop.returncode == 0, stop.stderr
        assert first.wait(timeout=120) != 0
    finally:
        if first.poll() is None:
            first.kill()
    assert RunLayout.open(stopped).latest_checkpoint() < ROLLOUTS     # stopped mid-way, not finished

    again = launch(config, stopped)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "continuing run" in again.stdout
    assert groups(stopped) == groups(straight)                # the same prompt sequence
    assert trained(stopped) == trained(straight)              # the same weights after every rollout


@pytest.mark.slow
def test_a_changed_config_is_refused_with_its_diff_unless_the_change_may_be_made(tiny_model, prompts, tmp_path):
    config = write_config(tmp_path / "run.yaml", tiny_model, prompts, num_rollouts=1)
    run_dir = tmp_path / "run"
    assert launch(config, run_dir).returncode == 0
    assert launch(config, run_dir).returncode == 0                  # finished: the same launch is a no-op

    longer = write_config(tmp_path / "longer.yaml", tiny_model, prompts, num_rollouts=2)
    r = launch(longer, run_dir)
    assert r.returncode == 2 and "train.num_rollouts: 1 -> 2" in r.stderr and "--accept-changes" in r.stderr
    other = write_config(tmp_path / "other.yaml", tiny_model, prompts, num_rollouts=2, lr=1e-4)
    r = launch(other, run_dir, "--accept-changes")
    assert r.returncode == 2 and "cannot change train.lr" in r.stderr, r.stderr
    assert RunLayout.open(run_dir).manifest().config["train"]["num_rollouts"] == 1    # refused: nothing changed

    r = launch(longer, run_dir, "--accept-changes")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(trained(run_dir)) == [0, 1]
    layout = RunLayout.open(run_dir)
    assert layout.manifest().config["train"]["num_rollouts"] == 2
    assert (run_dir / "launch/config-history/0.yaml").exists()      # the config before, kept


@pytest.mark.slow
def test_a_cancelled_slurm_job_is_continued_by_the_same_launch(slurm_env, tiny_model, prompts, tmp_path):
    """The same, as an sbatch job on the local Slurm cluster, ended by `agentrl stop` (scancel)."""
    from hpc.launch.state import final_state, still_running

    config = write_config(tmp_path / "run.yaml", tiny_model, prompts, slurm=True, num_rollouts=8)
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    r = launch(config, stopped, executor="sbatch", env=slurm_env)
    assert r.returncode == 0, r.stderr
    wait_until(lambda: checkpointed(stopped) >= 1 or final_state(RunLayout.open(stopped)), 400, "a checkpoint",
               poll_s=0.05)
    stop = subprocess.run([sys.executable, "-m", "agentrl.cli", "stop", str(stopped)], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env=slurm_env)
    assert stop.returncode == 0, stop.stderr
    wait_until(lambda: still_running(RunLayout.open(stopped)) is None, 120, "the cancelled job to leave the queue")
    assert checkpointed(stopped) < 8                                  # cancelled mid-way
    for run_dir in (stopped, straight):                               # continued; and one uninterrupted
        r = launch(config, run_dir, executor="sbatch", env=slurm_env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert ("continuing run" in r.stdout) == (run_dir == stopped), r.stdout
    for run_dir in (stopped, straight):
        wait_until(lambda d=run_dir: final_state(RunLayout.open(d)) is not None, 600, f"{run_dir.name} to end")
        assert final_state(RunLayout.open(run_dir)) == "finished", what_happened(run_dir)
    assert sorted(trained(straight)) == list(range(8))
    assert groups(stopped) == groups(straight) and trained(stopped) == trained(straight)
