"""The trainer loop on the tiny model, fed by a stand-in pool through the real ledger and buffer."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ci import require_module
from fake_pool import FakePool

from agentrl.run_config import RunConfigError, role_config
from agentrl.train.checkpoint import TrainerState
from agentrl.train.config import TrainConfigError, load_train_config
from agentrl.train.loop import Trainer
from hpc.records import read_record
from hpc.runlayout import RunLayout

pytestmark = pytest.mark.integration    # the trainer on a tiny model, checkpoints and all

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def prompts(bundled_prompts) -> Path:
    return bundled_prompts


@pytest.fixture
def ledger_events(monkeypatch) -> list[str]:
    """"open r" and "close r", in the order the trainer opens and closes rollouts in the ledger."""
    from hpc.ledger import Ledger

    events: list[str] = []
    real_close, real_open = Ledger.close_rollout, Ledger.open_rollout

    def close(self, r):
        events.append(f"close {r}")
        return real_close(self, r)

    def open_(self, r, *a, **kw):
        events.append(f"open {r}")
        return real_open(self, r, *a, **kw)

    monkeypatch.setattr(Ledger, "close_rollout", close)
    monkeypatch.setattr(Ledger, "open_rollout", open_)
    return events


def config(tiny_model, prompts, **over):
    base = {"model": str(tiny_model), "prompt_data": str(prompts), "num_rollouts": 2, "rollout_batch_size": 3,
            "n_samples_per_prompt": 2, "lr": 1e-3, "max_tokens_per_gpu": 256, "rollout_timeout_s": 60,
            "tracking": {"wandb": "disabled"}}
    return load_train_config({**base, **over})


def run_trainer(run_dir: Path, cfg, **pool) -> TrainerState:
    run = RunLayout.open(run_dir) if (run_dir / "run.yaml").exists() else RunLayout.create(run_dir)
    with FakePool(run_dir, **pool):
        return Trainer(run, cfg).train()


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_trains_rollouts_checkpoints_and_resumes_exactly(tiny_model, prompts, tmp_path, caplog):
    straight = tmp_path / "straight"
    with caplog.at_level("WARNING", logger="agentrl.train"):     # rollout r sampled by the weights of version r
        state = run_trainer(straight, config(tiny_model, prompts, num_rollouts=3, global_batch_size=3),
                            version=lambda claim: claim.rollout_id)
    assert (state.iteration, state.optimizer_steps) == (3, 6)      # 6 attempts per rollout, 3 per step
    run = RunLayout.open(straight)
    assert run.latest_checkpoint() == 3
    for n in (1, 2, 3):
        ck = run.checkpoint_dir(n)
        assert read_record(ck / "trainer.json", TrainerState).iteration == n
        assert (ck / "hf/model.safetensors").exists() and (ck / "hf/tokenizer.json").exists()
    lines = metrics(straight)
    assert [m["rollout"] for m in lines] == [0, 1, 2]
    assert all(m["attempts"] == 6 and m["samples"] == 9 and m["groups"] == 3 for m in lines)  # attempt 1 fans out
    assert len({m["fingerprint"] for m in lines}) == 3                  # the weights moved every rollout
    # The stand-in pool's log-probs are random, far from the model's. Each rollout's first step measures it on
    # the tokens its weights sampled (its first step's: 3 of the 6 attempts), and warns naming rollout and step;
    # the second step does not (the policy has moved since those weights).
    assert all(0 < m["train/mismatch_tokens"] < m["trained_tokens"] for m in lines)
    assert all(m["train/mismatch_max"] >= m["train/mismatch_mean"] > 1.0 for m in lines)
    warned = [rec.getMessage() for rec in caplog.records if "train.mismatch_warn" in rec.getMessage()]
    assert [w.split(":")[0] for w in warned] == [f"rollout {r}, step 0 (optimizer step {2 * r + 1})" for r in range(3)]

    # The same run, killed after rollout 1 and resumed: the same prompts, the same weights.
    resumed = tmp_path / "resumed"
    run_trainer(resumed, config(tiny_model, prompts, num_rollouts=2, global_batch_size=3))
    state = run_trainer(resumed, config(tiny_model, prompts, num_rollouts=3, global_batch_size=3))
    assert state.iteration == 3
    assert [m["fingerprint"] for m in metrics(resumed)] == [m["fingerprint"] for m in lines]
    spec = yaml.safe_load((resumed / "ledger/rollouts/2/g3/spec.json").read_text())
    assert spec["groups"] == [6, 7, 8]          # rollout 2's absolute groups, drawn as the long run drew them


def test_a_trainer_killed_after_opening_keeps_the_rollouts_commits(tiny_model, prompts, tmp_path):
    cfg = config(tiny_model, prompts, num_rollouts=1)
    run = RunLayout.create(tmp_path / "run")
    trainer = Trainer(run, cfg)
    from agentrl.prompts.source import PromptSource
    source = PromptSource(trainer.rows, rollout_batch_size=3, seed=0)
    trainer.open_rollout(0, source)
    gen = trainer.ledger.current_generation(0)
    with FakePool(run.root):
        trainer.wait_for_groups(0)
    # "killed" here; a new trainer reuses the open generation instead of reopening (and losing) it
    state = run_trainer(run.root, cfg)
    assert trainer.ledger.current_generation(0) == gen and state.iteration == 1


def test_config_errors_name_the_field(tiny_model, prompts, tmp_path):
    with pytest.raises(TrainConfigError, match="train: global_batch_size 4 does not divide"):
        config(tiny_model, prompts, global_batch_size=4)
    with pytest.raises(TrainConfigError, match="train.lr: Input should be greater than 0"):
        config(tiny_model, prompts, lr=0)
    with pytest.raises(TrainConfigError, match="train.learning_rate: unknown key"):
        config(tiny_model, prompts, learning_rate=1)
    with pytest.raises(TrainConfigError, match="holds no config.json"):
        config(tmp_path, prompts)
    bad = tmp_path / "c.yaml"
    bad.write_text("trainer: {}\n")
    with pytest.raises(RunConfigError, match="c.yaml: trainer: unknown section"):
        role_config(None, bad)
    bad.write_text("pool: {}\n")
    with pytest.raises(RunConfigError, match="c.yaml: has no `train:` section"):
        role_config(None, bad).section("train")


@pytest.mark.parametrize("how", ["config-file", "launched-role"])
def test_agentrl_train_command_runs_a_rollout(tiny_model, prompts, tmp_path, how):
    shutil.copy(prompts, tmp_path / "prompts.jsonl")
    train = {"model": str(tiny_model), "prompt_data": "prompts.jsonl", "num_rollouts": 1, "rollout_batch_size": 2,
             "n_samples_per_prompt": 2, "max_tokens_per_gpu": 256}
    run_dir = tmp_path / "runs/exp1"
    cmd, env = [sys.executable, "-m", "agentrl.cli", "train"], dict(os.environ)
    if how == "config-file":
        cfg = tmp_path / "run.yaml"
        cfg.write_text(yaml.safe_dump({"train": train}))
        cmd += [str(run_dir), "--config", str(cfg)]
    else:   # as `agentrl launch` starts it: the run holds the config; paths are relative to the run
        RunLayout.create(run_dir, config={"train": dict(train, prompt_data="../../prompts.jsonl")})
        env.update(AGENTRL_RUN_DIR=str(run_dir), AGENTRL_ROLE="trainer", AGENTRL_TASK_INDEX="0")
    with FakePool(run_dir):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trained 1 rollouts" in r.stdout and "rollout 0: 2/2 groups complete" in r.stderr
    assert RunLayout.open(run_dir).latest_checkpoint() == 1


def test_agentrl_train_without_a_run_says_what_to_give(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_")}
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "train"], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=env)
    assert r.returncode == 2 and "give RUN_DIR" in r.stderr
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", str(tmp_path)], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 2 and "not a run directory" in r.stderr


@pytest.mark.slurm
def test_two_ranks_as_slurm_tasks_train_one_model(slurm_env, tiny_model, prompts, tmp_path):
    """DDP over gloo, one rank per Slurm task on two nodes: the ranks must end with the same weights."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"train": {"model": str(tiny_model), "prompt_data": str(prompts),
                                             "num_rollouts": 2, "rollout_batch_size": 2, "n_samples_per_prompt": 2,
                                             "lr": 1e-3, "max_tokens_per_gpu": 128}}))
    run_dir = tmp_path / "run"
    with FakePool(run_dir, version=lambda claim: claim.rollout_id):
        r = subprocess.run(["srun", "-p", "cpu", "-N2", "-n2", "--exact", "-c1", "--mem=1500", sys.executable, "-m",
                            "agentrl.cli", "train", str(run_dir), "--config", str(cfg)],
                           capture_output=True, text=True, timeout=600, cwd=ROOT, env=slurm_env)
    assert r.returncode == 0, r.stderr[-4000:]
    ranks = [json.loads((run_dir / f"logs/train-rank{k}.json").read_text()) for k in (0, 1)]
    assert ranks[0] == ranks[1] and ranks[0]["rollout"] == 1
    lines = metrics(run_dir)
    assert [m["rollout"] for m in lines] == [0, 1] and lines[-1]["fingerprint"] == ranks[0]["fingerprint"]
    # Each rank trained its own micro-batches: the step's tokens are summed over both, and so is the count
    # of tokens the sampler/trainer mismatch was measured on (every trained token, from both ranks).
    assert all(m["train/step_tokens"] >= m["train/step_samples"] for m in lines)
    assert all(m["train/mismatch_tokens"] == m["trained_tokens"] > 0 for m in lines)
    assert all(m["train/mismatch_max"] >= m["train/mismatch_mean"] > 0 for m in lines)


def test_weights_reach_the_inference_server_before_the_next_rollout_opens(tiny_model, prompts, tmp_path):
    import httpx

    from hpc.inference.cpu_server import Engine, ServerThread
    from hpc.registry import Registry

    run = RunLayout.create(tmp_path / "run")
    seen: dict[int, set[str]] = {}

    class WatchingPool(FakePool):
        """Asks the server for its weight version whenever it claims: the rollout's policy."""
        def _loop(self):
            import hpc.ledger as ledger_mod
            real_claim = ledger_mod.Ledger.claim

            def claim(ledger, *a, **kw):
                c = real_claim(ledger, *a, **kw)
                if c is not None:
                    version = httpx.get(f"{server.url}/get_model_info", timeout=10).json()["weight_version"]
                    seen.setdefault(c.rollout_id, set()).add(version)
                return c
            ledger_mod.Ledger.claim = claim
            try:
                super()._loop()
            finally:
                ledger_mod.Ledger.claim = real_claim

    with ServerThread(Engine(tiny_model, weight_version="0")) as server:
        port = int(server.url.rsplit(":", 1)[1])
        Registry(run.services_dir).register("inference", 0, host="127.0.0.1", port=port)
        with WatchingPool(run.root):
            state = Trainer(run, config(tiny_model, prompts, num_rollouts=3)).train()
        final = httpx.get(f"{server.url}/get_model_info", timeout=10).json()["weight_version"]
    assert seen == {0: {"0"}, 1: {"1"}, 2: {"2"}}
    assert final == "2" and state.weight_version == 2        # not after the last rollout: no eval follows
    lines = metrics(run.root)
    assert [m.get("weight_version") for m in lines] == [1, 2, None] and lines[0]["inference_servers"] == 1


def test_colocated_servers_release_memory_only_after_the_rollout_closes(tiny_model, prompts, tmp_path, ledger_events):
    """The protocol's order on CPU: the memory release itself needs a GPU (SGLang's memory saver)."""
    import httpx

    from hpc.inference.sglang import SGLangClient
    from hpc.registry import Registry

    events = ledger_events
    version = {"v": "0"}

    def server(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/model_info":
            return httpx.Response(200, json={"weight_version": version["v"]})
        if path == "/update_weights_from_disk":
            version["v"] = json.loads(request.content)["weight_version"]
        events.append(path.strip("/"))
        return httpx.Response(200, json={"success": True})

    run = RunLayout.create(tmp_path / "run")
    Registry(run.services_dir).register("inference", 0, host="gpu1", port=30000)
    trainer = Trainer(run, config(tiny_model, prompts, num_rollouts=2, colocated=True),
                      inference_client=lambda url: SGLangClient(url, transport=httpx.MockTransport(server)))
    with FakePool(run.root):
        trainer.train()
    cycle = ["pause_generation", "release_memory_occupation", "resume_memory_occupation"]
    assert events == ["open 0", "close 0", *cycle, "update_weights_from_disk", "flush_cache", "continue_generation",
                      "open 1", "close 1", *cycle, "continue_generation"]   # no new weights after the last rollout


def test_metrics_also_go_to_an_offline_wandb_run(tiny_model, prompts, tmp_path):
    require_module("wandb", "the offline W&B test", "pip install -e '.[wandb]'")
    run = RunLayout.create(tmp_path / "run")
    with FakePool(run.root, version=lambda claim: claim.rollout_id):
        Trainer(run, config(tiny_model, prompts, num_rollouts=2, tracking={"wandb": "offline"})).train()
    # The transaction log is whole on disk once W&B's service stops, which a trainer's process does at exit
    # (wandb's atexit): this test's process lives on, so stop it here (CI once read the log's header alone).
    import wandb

    wandb.teardown()
    run_id = run.manifest().run_id
    [data] = (run.root / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")   # `wandb sync` uploads it
    # W&B's transaction log is protobuf: the logged metrics' names and the run's config are in it verbatim.
    logged = data.read_bytes()
    for key in (b"reward_mean", b"train/loss", b"train/mismatch_mean", b"pass@2", b"rollout_batch_size"):
        assert key in logged, key


def test_the_control_trains_on_shuffled_rewards_and_reports_the_true_ones(tiny_model, prompts, tmp_path):
    real, control = tmp_path / "real", tmp_path / "control"
    run_trainer(real, config(tiny_model, prompts, num_rollouts=2, global_batch_size=3))
    run_trainer(control, config(tiny_model, prompts, num_rollouts=2, global_batch_size=3, control="shuffle_rewards"))
    a, b = metrics(real), metrics(control)
    assert [m["reward_mean"] for m in a] == [m["reward_mean"] for m in b]     # the same rollouts, true rewards
    assert [m["fingerprint"] for m in a] != [m["fingerprint"] for m in b]     # trained on other advantages
    with pytest.raises(TrainConfigError, match="control"):
        config(tiny_model, prompts, control="flip_rewards")


def test_full_checkpoints_every_save_every_exports_between_and_old_state_pruned(tiny_model, prompts, tmp_path):
    from agentrl.train.checkpoint import apply_retention

    run_dir = tmp_path / "bounded"
    straight = tmp_path / "straight"
    cfg = dict(num_rollouts=4, global_batch_size=3, save_every=2, publish_every=1, keep_last=1)
    run_trainer(run_dir, config(tiny_model, prompts, **cfg))
    run = RunLayout.open(run_dir)
    assert run.latest_checkpoint() == 4
    kinds = {n: (read_record(run.checkpoint_dir(n) / "trainer.json", TrainerState).full,
                 (run.checkpoint_dir(n) / "optimizer.pt").exists(), (run.checkpoint_dir(n) / "hf").is_dir())
             for n in (1, 2, 3, 4)}
    # 1 and 3 published only their export; 2 was full until 4 made it the older of two; 4 is full
    assert kinds == {1: (False, False, True), 2: (False, False, True), 3: (False, False, True), 4: (True, True, True)}
    # An export goes once its eval summary exists, never the weights the servers were last told to load
    for n in (1, 3):
        run.eval_dir(n).mkdir(parents=True)
        (run.eval_dir(n) / "summary.json").write_text("{}")
    assert run.published_weights()[0] == 3
    plan = apply_retention(run, keep_last=1, keep_exports="until_evaluated")
    assert plan.drop_export == (1,) and not (run.checkpoint_dir(1) / "hf").exists()
    assert (run.checkpoint_dir(3) / "hf").is_dir()

    # Resumed from a full checkpoint with an export-only one after it: the rollouts are trained again
    # from the ledger, to the same weights as a run that never stopped
    run_trainer(straight, config(tiny_model, prompts, num_rollouts=4, global_batch_size=3))
    resumed = tmp_path / "resumed"
    run_trainer(resumed, config(tiny_model, prompts, **{**cfg, "num_rollouts": 3, "keep_last": 2}))
    again = RunLayout.open(resumed)
    shutil.rmtree(again.checkpoint_dir(3))
    again.publish_latest(2)        # as if the trainer had died after rollout 3's export, before a full save
    run_trainer(resumed, config(tiny_model, prompts, **cfg))
    assert [m["fingerprint"] for m in metrics(resumed)][-2:] == [m["fingerprint"] for m in metrics(straight)][-2:]


def test_a_server_answering_200_without_json_is_not_taken_for_a_publish():
    """A proxy's 200 page, say: the weights were not loaded, and the publish says so."""
    import httpx

    from hpc.inference.sglang import SGLangClient, SGLangError

    client = SGLangClient("http://gpu1:30000", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, text="<html>welcome</html>")))
    with pytest.raises(SGLangError, match="answered 200 with no JSON: '<html>welcome</html>'"):
        client.update_weights(Path("/ckpt/iter_1/hf"), 1)


def test_rollouts_run_ahead_of_training_and_stale_tokens_never_reach_a_step(tiny_model, prompts, tmp_path,
                                                                             ledger_events):
    """max_staleness 1: rollout r+1 is open (and worked on) while r trains. Tokens of weights more than one
    rollout behind the policy are masked: a rollout left with none trains no step."""
    events = ledger_events
    stepped: dict[str, list[tuple[int, set[int]]]] = {}

    class Recording(Trainer):
        """Records, for every train step, the policy's version and the versions of the tokens it trains."""
        def make_policy(self):
            policy = super().make_policy()
            real_step = policy.train_step

            def step(batch, plan):
                seen = {int(v) for mb in plan.micro_batches for i in mb
                        for v, m in zip(batch.samples[i].token_versions, batch.samples[i].loss_mask, strict=True) if m}
                stepped.setdefault(self.run.root.name, []).append((self.iteration, seen))
                return real_step(batch, plan)
            policy.train_step = step
            return policy

        def one_rollout(self, r, *a):
            self.iteration = r
            return super().one_rollout(r, *a)

    def published(run: RunLayout):
        """The version a server serves when the pool claims: the one last published."""
        return lambda claim: (run.published_weights() or (0, None))[0]

    ahead = RunLayout.create(tmp_path / "ahead")
    with FakePool(ahead.root, version=published(ahead)):
        Recording(ahead, config(tiny_model, prompts, num_rollouts=3, max_staleness=1)).train()
    order = list(events)
    stale = RunLayout.create(tmp_path / "stale")
    with FakePool(stale.root, version=lambda claim: 0):       # a server that never took new weights
        Recording(stale, config(tiny_model, prompts, num_rollouts=3, max_staleness=1)).train()
    assert order == ["open 0", "open 1", "close 0", "open 2", "close 1", "close 2"]
    for r, versions in stepped["ahead"]:
        assert versions and all(0 <= r - v <= 1 for v in versions), (r, versions)
    lines = metrics(ahead.root)
    assert all(m["staleness/masked_tokens"] == 0 and "train/loss" in m for m in lines)
    assert sum(m.get("staleness/tokens_lag_1", 0) for m in lines) > 0    # some tokens came from a rollout behind

    assert [r for r, _ in stepped["stale"]] == [0, 1] and all(v == {0} for _, v in stepped["stale"])
    last = metrics(stale.root)[-1]
    assert last["rollout"] == 2 and "train/loss" not in last and last["staleness/dropped_samples"] == 9
    assert last["staleness/masked_tokens"] == last["staleness/tokens_lag_2"] > 0


def test_a_rollout_whose_publish_failed_after_its_checkpoint_keeps_its_metrics_line(tiny_model, prompts, tmp_path):
    """Rollout 0 trains and checkpoints, then its publish is refused: the trainer fails, and the one that
    resumes after rollout 0 writes rollout 0's line from the checkpoint, once, before its own."""
    import httpx

    from agentrl.train.publish import PublishError
    from hpc.inference.sglang import SGLangClient
    from hpc.registry import Registry

    refuse = {"on": True}

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/update_weights_from_disk" and refuse["on"]:
            return httpx.Response(400, json={"success": False, "message": "out of memory"})
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"weight_version": "1"})
        return httpx.Response(200, json={"success": True})

    run = RunLayout.create(tmp_path / "run")
    Registry(run.services_dir).register("inference", 0, host="gpu1", port=30000)
    client = lambda url: SGLangClient(url, transport=httpx.MockTransport(server))   # noqa: E731
    cfg = config(tiny_model, prompts, num_rollouts=2)
    with FakePool(run.root), pytest.raises(PublishError, match="out of memory"):
        Trainer(run, cfg, inference_client=client).train()
    assert run.latest_checkpoint() == 1 and not run.metrics_path.exists()
    saved = read_record(run.checkpoint_dir(1) / "trainer.json", TrainerState).metrics
    assert saved["rollout"] == 0 and saved["attempts"] == 6

    refuse["on"] = False
    with FakePool(run.root):
        Trainer(run, cfg, inference_client=client).train()
        Trainer(run, cfg, inference_client=client).train()     # nothing left to train: nothing written twice
    lines = metrics(run.root)
    assert [m["rollout"] for m in lines] == [0, 1]
    assert lines[0]["recovered_from_checkpoint"] and lines[0]["fingerprint"] == saved["fingerprint"]
    assert "publish_s" not in lines[0] and "recovered_from_checkpoint" not in lines[1]
