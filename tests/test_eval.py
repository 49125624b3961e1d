"""Checkpoint eval from the filesystem: reproducible results, resuming after kill -9, watching a run."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agentrl.swe.harbor import BUNDLED_TASKS
from agentrl.train.checkpoint import TrainerState
from hpc.ledger import Ledger
from hpc.records import write_record
from hpc.runlayout import RunLayout

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (make sysdeps)")]


@pytest.fixture
def setup(tiny_model, tmp_path):
    """A run with an eval section: two bundled tasks, the builtin agent, short generations."""
    data = tmp_path / "eval.jsonl"
    subprocess.run([sys.executable, "-m", "agentrl.cli", "convert", "harbor", str(BUNDLED_TASKS / "roman-subtractive"),
                    str(BUNDLED_TASKS / "csv-quote-escaping"), "--out", str(data)], check=True, capture_output=True,
                   cwd=ROOT)
    config = {"eval": {"tasks": str(data), "n_samples": 2, "temperature": 1.0, "seed": 5,
                       "pool": {"harness": "builtin", "max_agents": 2, "max_booting": 2,
                                "adapter": {"max_new_tokens": 24, "max_context": 4096}, "lease_s": 10, "poll_s": 0.2,
                                "tools_dir": str(tmp_path / "tools")}}}
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(yaml.safe_dump(config))
    return cfg, data


def checkpoint(run: RunLayout, n: int, model: Path, slowly: float = 0.0) -> Path:
    """iter_<n> as the trainer leaves it; `slowly` spreads the writes out, trainer.json still last."""
    d = run.checkpoint_dir(n)
    (d / "hf").mkdir(parents=True)
    for f in sorted(model.iterdir()):
        if f.is_file():
            shutil.copy(f, d / "hf" / f.name)
            time.sleep(slowly)
    write_record(d / "trainer.json", TrainerState(iteration=n, optimizer_steps=n, weight_version=n, prompt_source={}))
    return d


def eval_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentrl.cli", "eval", *args]


def test_the_same_checkpoint_tasks_and_seed_give_the_same_results(setup, tiny_model, tmp_path):
    cfg, _ = setup
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        r = subprocess.run(eval_cmd(str(tiny_model), "--config", str(cfg), "--out", str(out)), capture_output=True,
                           text=True, timeout=300, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
    a, b = ((out / "results.jsonl").read_text() for out in outs)
    assert a == b and len(a.splitlines()) == 4
    summary = json.loads((outs[0] / "summary.json").read_text())
    assert summary["attempts"] == 4 and summary["k"] == 2 and summary["config"]["seed"] == 5
    assert {"pass@1", "pass@2", "pass@k", "empty_patch_rate", "infra_failures", "timings"} <= set(summary)
    assert summary["timings"]["agent_s"] > 0


@pytest.mark.slow
def test_a_killed_eval_resumes_without_redoing_or_missing_attempts(setup, tiny_model, tmp_path):
    cfg, _ = setup
    out = tmp_path / "out"
    first = subprocess.Popen(eval_cmd(str(tiny_model), "--config", str(cfg), "--out", str(out), "--n", "4"),
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def committed() -> int:
        if not (out / "ledger/ledger.json").exists() or Ledger(out / "ledger").current_generation(0) is None:
            return 0
        return len(Ledger(out / "ledger").commits(0))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and committed() < 2:
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)
    first.wait()
    done_before = len(Ledger(out / "ledger").commits(0))
    assert 0 < done_before < 8 and not (out / "summary.json").exists()
    r = subprocess.run(eval_cmd(str(tiny_model), "--config", str(cfg), "--out", str(out), "--n", "4"),
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((x["task"], x["attempt"]) for x in lines) == sorted(
        (t, a) for t in ("csv-quote-escaping", "roman-subtractive") for a in range(4))
    assert json.loads((out / "summary.json").read_text())["attempts"] == 8


def test_the_watcher_scores_checkpoints_as_they_land_never_half_written(setup, tiny_model, tmp_path):
    cfg, _ = setup
    run = RunLayout.create(tmp_path / "run", config=yaml.safe_load(cfg.read_text()))
    checkpoint(run, 1, tiny_model)
    watcher = subprocess.Popen(eval_cmd("--watch", str(run.root), "--until-done"), cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        checkpoint(run, 2, tiny_model)
        # iter_3 lands slowly: its directory exists for seconds before trainer.json completes it
        slow = run.checkpoint_dir(3)
        (slow / "hf").mkdir(parents=True)
        for f in sorted(tiny_model.iterdir()):
            if f.is_file():
                shutil.copy(f, slow / "hf" / f.name)
                time.sleep(0.3)
                assert not run.eval_dir(3).exists(), "a half-written checkpoint was read"
        write_record(slow / "trainer.json", TrainerState(iteration=3, optimizer_steps=3, weight_version=3,
                                                         prompt_source={}))
        subprocess.run([sys.executable, "-m", "hpc.launch.state", str(run.root), "finished"], check=True, cwd=ROOT)
        out, err = watcher.communicate(timeout=600)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0, err.decode()[-3000:]
    assert b"scored 3 checkpoints: iter_1, iter_2, iter_3" in out
    for n in (1, 2, 3):
        summary = json.loads((run.eval_dir(n) / "summary.json").read_text())
        assert summary["iteration"] == n and summary["attempts"] == 4


def test_eval_refuses_a_missing_task_set_and_bad_config(tiny_model, tmp_path):
    r = subprocess.run(eval_cmd(str(tiny_model)), capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 2 and "give --tasks DATA" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"eval": {"tasks": "x.jsonl", "n_samples": 0}}))
    r = subprocess.run(eval_cmd(str(tiny_model), "--config", str(bad)), capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 2 and "eval.n_samples: Input should be greater than 0" in r.stderr
    r = subprocess.run(eval_cmd(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "give a CHECKPOINT, or --watch RUN" in r.stderr


def test_the_cpu_engine_serves_on_the_servers_threads_and_gives_the_process_its_own_back(tiny_model, tmp_path):
    """eval runs the CPU stand-in in its own process, beside the sandboxes: on SERVER_THREADS while it serves."""
    import torch

    from agentrl.eval.config import EvalConfig
    from agentrl.eval.score import model_server
    from hpc.inference.cpu_server import SERVER_THREADS

    before = torch.get_num_threads()
    torch.set_num_threads(SERVER_THREADS + 1)
    try:
        with model_server(EvalConfig(tasks=str(tmp_path)), tiny_model, 0, tmp_path):
            assert torch.get_num_threads() == SERVER_THREADS
        assert torch.get_num_threads() == SERVER_THREADS + 1
    finally:
        torch.set_num_threads(before)
