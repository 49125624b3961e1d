"""Acceptance: the whole loop on the local Slurm cluster with Claude Code as the harness.

Roles as Slurm steps: a scripted inference server (its token choices come from a script; it
alternates a fixing and a non-fixing shell call, so each rollout's one group of two attempts,
run side by side, gets rewards 1 and 0 and a nonzero advantage), a pool running Claude Code in bubblewrap
sandboxes through the adapter, and the torch trainer, for three training steps. Every trained
token must be a token the model sampled, in the order it was sampled.
"""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from ci import skip_or_fail

from agentrl.sample import SAMPLE_CODEC
from agentrl.swe.harbor import BUNDLED_TASKS
from hpc.buffer import read_rollout
from hpc.launch.state import final_state as state_of
from hpc.ledger import Ledger
from hpc.runlayout import RunLayout

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
CLAUDE = ROOT / ".agent-clis/node_modules/.bin/claude"


def spans(mask: np.ndarray, tokens: np.ndarray) -> list[tuple[int, ...]]:
    """The runs of trained (mask 1) tokens."""
    out, current = [], []
    for m, t in zip(mask, tokens, strict=True):
        if m:
            current.append(int(t))
        elif current:
            out.append(tuple(current))
            current = []
    return out + ([tuple(current)] if current else [])


@pytest.mark.slurm
@pytest.mark.timeout(1200)
def test_three_training_steps_with_claude_code_on_slurm(slurm_env, tiny_model, tmp_path):
    if shutil.which("bwrap") is None or not CLAUDE.exists():
        problem = "needs bubblewrap (make sysdeps) and Claude Code (make clis)"
        skip_or_fail("the Claude Code end-to-end test", problem)
    prompts = tmp_path / "prompts.jsonl"
    subprocess.run([sys.executable, "-m", "agentrl.cli", "convert", "harbor", str(BUNDLED_TASKS / "roman-subtractive"),
                    "--out", str(prompts)], check=True, capture_output=True, cwd=ROOT)
    config = {
        "launch": {"name": "e2e-claude", "time_limit_min": 30,
                   "partitions": {"cpu": {"nodes": ["cpu1"], "cpus_per_node": 8, "mem_mb": 8000}},
                   "roles": {
                       "inference": {"command": [sys.executable, str(ROOT / "tests/roles/scripted_inference.py"),
                                                 str(tiny_model), "Bash"],
                                     "partition": "cpu", "mem_per_task_mb": 1500,
                                     "restart": {"policy": "restart", "max_restarts": 2, "backoff_s": 2}},
                       "pool": {"command": ["agentrl", "pool"], "partition": "cpu", "cpus_per_task": 2,
                                "mem_per_task_mb": 3000, "restart": {"policy": "restart", "max_restarts": 2}},
                       "trainer": {"command": ["agentrl", "train"], "partition": "cpu", "cpus_per_task": 2,
                                   "mem_per_task_mb": 3000, "restart": {"policy": "fail-run"}}}},
        "train": {"model": str(tiny_model), "prompt_data": str(prompts), "num_rollouts": 3, "rollout_batch_size": 1,
                  "n_samples_per_prompt": 2, "lr": 1e-3, "max_tokens_per_gpu": 131072, "publish_every": 100,
                  "rollout_timeout_s": 600, "tracking": {"wandb": "disabled"}},
        "pool": {"harness": "claude_code", "max_agents": 2, "max_booting": 2,
                 "adapter": {"max_context": 131072, "max_new_tokens": 2048}, "lease_s": 120,
                 "tools_dir": str(tmp_path / "tools")},
    }
    cfg = tmp_path / "e2e.yaml"
    cfg.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "launch", str(cfg), "--executor", "sbatch",
                        "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=slurm_env)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 1000
    run = RunLayout.open(run_dir)
    while state_of(run) is None and time.monotonic() < deadline:
        time.sleep(3)
    logs = "".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted((run_dir / "logs").glob("*.log")))
    assert state_of(run) == "finished", logs

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["rollout"] for m in lines] == [0, 1, 2] and run.latest_checkpoint() == 3
    assert len({m["fingerprint"] for m in lines}) == 3               # three steps, each moved the weights
    sampled = {tuple(json.loads(line)) for line in (run_dir / "logs/sampled.jsonl").read_text().splitlines()}
    ledger, rewards = Ledger(run.ledger_dir), {}
    for r_ in range(3):
        for samples in read_rollout(ledger, run.buffer_dir, r_, SAMPLE_CODEC).values():
            for s in samples:
                assert s.metadata.harness == "claude_code" and s.metadata.exit_code == 0, s.metadata
                response = s.tokens[len(s.tokens) - s.response_length:]
                trained = spans(s.loss_mask, response)
                # the shell call's tokens, then the answer's: exactly what the model sampled, nothing else
                assert len(trained) == 2 and all(t in sampled for t in trained), trained
                rewards.setdefault(r_, []).append(s.reward)
    assert {r_: sorted(found) for r_, found in rewards.items()} == {r_: [0.0, 1.0] for r_ in range(3)}, rewards
