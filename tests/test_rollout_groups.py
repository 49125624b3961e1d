"""Issue 15, defect 2: the pool grades the task the trainer credits, because it reads what each group is
from the ledger (as the trainer opened it) and refuses prompt data other than the trainer's."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.pool.config import load_pool_config
from agentrl.pool.worker import PoolWorker
from agentrl.prompts.groups import RolloutGroups, RolloutGroupsError, open_rollout
from agentrl.prompts.source import PromptSource, load_prompt_rows, rows_fingerprint
from hpc.ledger import Ledger
from hpc.runlayout import RunLayout

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def prompts(bundled_prompts) -> Path:
    return bundled_prompts


def trainer_opens(run: RunLayout, prompts: Path, *, rollout=1, seed=3, temperature=1.0) -> PromptSource:
    """What the trainer does: its own source (seed, batch size), the groups' tasks in the payload."""
    source = PromptSource(load_prompt_rows(prompts), rollout_batch_size=4, seed=seed)
    open_rollout(Ledger(run.ledger_dir), source, rollout, attempts=1, temperature=temperature)
    return source


def test_the_pool_grades_the_task_the_trainer_opened_not_one_it_recomputes(prompts, tmp_path):
    run = RunLayout.create(tmp_path / "run")
    source = trainer_opens(run, prompts, seed=3)
    # The pool knows nothing of the trainer's seed or batch size: with its own it would pick other rows.
    mine = PromptSource(load_prompt_rows(prompts), rollout_batch_size=2, seed=0)
    theirs = [source.row_index(g) for g in source.group_indices(1)]
    assert [mine.row_index(g) for g in mine.group_indices(1)] != theirs
    worker = PoolWorker(run, load_pool_config({}), Path("unused-tokenizer"), prompts)
    graded = {}
    while (claim := worker.ledger.claim("w", check=worker.check_rollout)) is not None:
        graded[claim.group] = worker.task_for(claim).spec.instance_id
    opened = {g: source.rows[source.row_index(g)]["metadata"]["instance_id"] for g in source.group_indices(1)}
    assert graded == opened and len(set(opened.values())) == 4


def test_a_pool_on_other_prompt_data_refuses_the_rollout_naming_both_hashes(prompts, tmp_path):
    run = RunLayout.create(tmp_path / "run")
    trainer_opens(run, prompts)
    rows = load_prompt_rows(prompts)
    regenerated = tmp_path / "regenerated.jsonl"      # the same tasks, written in another order
    regenerated.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))
    worker = PoolWorker(run, load_pool_config({}), Path("unused-tokenizer"), regenerated)
    with pytest.raises(RolloutGroupsError) as e:
        worker.ledger.claim("w", check=worker.check_rollout)
    assert rows_fingerprint(rows) in str(e.value) and rows_fingerprint(list(reversed(rows))) in str(e.value)
    st = Ledger(run.ledger_dir).status(1)
    assert (st.claimed, st.failed, st.pending) == (0, 0, 4)       # refused without spending a try


def test_a_pool_sampling_at_another_temperature_refuses_the_rollout(prompts, tmp_path):
    run = RunLayout.create(tmp_path / "run")
    trainer_opens(run, prompts, temperature=0.8)
    worker = PoolWorker(run, load_pool_config({"temperature": 1.0}), Path("unused-tokenizer"), prompts)
    with pytest.raises(ValueError, match="pool.temperature 1.0 differs from train.rollout_temperature 0.8"):
        worker.ledger.claim("w", check=worker.check_rollout)
    # Without pool.temperature the pool samples at the trainer's, whatever its own config's train: says.
    worker = PoolWorker(run, load_pool_config({}), Path("unused-tokenizer"), prompts)
    claim = worker.ledger.claim("w", check=worker.check_rollout)
    assert worker.cfg.sampling(worker.groups_of(claim).temperature)["temperature"] == 0.8


def test_a_rollout_opened_without_groups_or_with_a_bad_payload_is_refused_by_name(prompts, tmp_path):
    run = RunLayout.create(tmp_path / "run")
    led = Ledger(run.ledger_dir)
    led.open_rollout(0, [0, 1], 1)                                           # an older trainer: no payload
    worker = PoolWorker(run, load_pool_config({}), Path("unused-tokenizer"), prompts)
    with pytest.raises(RolloutGroupsError, match="opened without its groups' tasks"):
        led.claim("w", check=worker.check_rollout)
    with pytest.raises(RolloutGroupsError, match=r"payload.temperature: .*greater than 0"):
        RolloutGroups.parse({"prompt_data_sha256": "x", "num_rows": 1, "temperature": 0, "groups": {}}, "rollout 0")


@pytest.mark.integration
def test_agentrl_pool_with_another_config_exits_2_before_claiming(tiny_model, prompts, tmp_path):
    rows = load_prompt_rows(prompts)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    run = RunLayout.create(tmp_path / "run", config={"train": {"model": "m", "prompt_data": str(prompts)}})
    trainer_opens(run, prompts)
    config = tmp_path / "other.yaml"
    config.write_text(json.dumps({"train": {"model": str(tiny_model), "prompt_data": str(other), "num_rollouts": 2,
                                            "rollout_batch_size": 4, "n_samples_per_prompt": 1},
                                  "pool": {"tools_dir": str(tmp_path / "tools"), "poll_s": 0.1}}))
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "pool", str(run.root), "--config", str(config)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2, r.stderr[-3000:]
    assert rows_fingerprint(rows) in r.stderr and rows_fingerprint(rows[:5]) in r.stderr
    assert Ledger(run.ledger_dir).status(1).claimed == 0
