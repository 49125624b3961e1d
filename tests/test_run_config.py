"""Issue 15, defect 5: one run config, every section checked at launch, paths resolved in one place."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agentrl.adapter.service import AdapterConfig
from agentrl.run_config import RunConfigError, load_run_config, role_config
from hpc.launch.state import read_task_records
from hpc.runlayout import RunLayout

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = {"cpu": {"nodes": ["cpu1"], "cpus_per_node": 4, "mem_mb": 4000, "gpus_per_node": 0}}


def launch_section(*roles: tuple[str, list[str], dict]) -> dict:
    return {"name": "cfg", "time_limit_min": 5, "partitions": PARTITIONS,
            "roles": {name: {"command": command, "partition": "cpu", "mem_per_task_mb": 200, "restart": restart}
                      for name, command, restart in roles}}


def agentrl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.integration
@pytest.mark.parametrize("dry_run", [True, False])
def test_launch_refuses_a_bad_eval_or_pool_section_before_anything_is_submitted(tmp_path, dry_run):
    never = [sys.executable, "-c", "open('STARTED', 'w')"]
    base = {"run_dir": str(tmp_path / "run"), "launch": launch_section(("pool", never, {"policy": "restart"}))}
    cases = [({"eval": {"tasks": "t.jsonl", "n_samples": 0}}, "eval.n_samples: Input should be greater than 0"),
             ({"pool": {"max_agents": "many"}}, "pool.max_agents: Input should be a valid integer"),
             ({"pool": {"harnes": "builtin"}}, "pool.harnes: unknown key (a typo?)"),
             ({"pool": {"harness": "aider"}}, "pool.harness: unknown harness 'aider'; known: builtin, claude_code"),
             ({"pool": {"harness": "openhands", "adapter": {"max_context": 8192, "max_new_tokens": 512}}},
              "pool: harness openhands needs adapter.max_context >= 16384 (the OpenHands SDK refuses a smaller context "
              "window at start); got 8192: raise adapter.max_context"),
             ({"evaluation": {}}, "evaluation: unknown section (a typo?")]
    for extra, message in cases:
        config = write(tmp_path / "run.yaml", {**base, **extra})
        r = agentrl("launch", str(config), "--executor", "local", *(["--dry-run"] if dry_run else []))
        assert r.returncode == 2 and f"{config}: {message}" in r.stderr, r.stderr
        assert not (tmp_path / "run").exists() and not (ROOT / "STARTED").exists()


def test_paths_are_resolved_once_against_the_config_file_and_run_yaml_keeps_them(tiny_model, tmp_path):
    here = tmp_path / "configs"
    here.mkdir()
    (here / "prompts.jsonl").write_text('{"prompt": "p"}\n')
    data = {"train": {"model": str(tiny_model), "prompt_data": "prompts.jsonl", "num_rollouts": 1,
                      "rollout_batch_size": 1, "n_samples_per_prompt": 1},
            "pool": {"tools_dir": "tools", "scratch_dir": "/abs/scratch"},
            "eval": {"tasks": "eval.jsonl", "pool": {"image_cache": "cache"}},
            "inference": {"engine": "sglang", "model": "weights", "container": "sglang.sif",
                          "binds": ["data:/data", "/abs"]}}
    config = load_run_config(data, here, "run.yaml")
    assert config.train.prompt_data == here / "prompts.jsonl"
    assert config.pool.tools_dir == here / "tools" and str(config.pool.scratch_dir) == "/abs/scratch"
    assert config.eval.tasks == here / "eval.jsonl" and config.eval.pool.image_cache == here / "cache"
    inference = config.section("inference")
    assert inference["model"] == str(here / "weights") and inference["container"] == str(here / "sglang.sif")
    assert inference["binds"] == [f"{here / 'data'}:/data", "/abs"]
    # run.yaml stores the resolved config: a role started anywhere reads the same paths.
    run = RunLayout.create(tmp_path / "run", config=config.raw)
    again = role_config(run.root, None)
    assert again.train == config.train and again.section("inference") == inference


def test_every_problem_of_every_section_is_reported_at_once(tiny_model, tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "p"}\n')
    with pytest.raises(RunConfigError) as e:
        load_run_config({"train": {"model": str(tiny_model), "prompt_data": "p.jsonl", "num_rollouts": 1,
                                   "rollout_batch_size": 1, "n_samples_per_prompt": 1, "rollout_temperature": 1.0},
                         "pool": {"temperature": 0.7},
                         "eval": {"tasks": "e.jsonl", "top_p": 2, "sglang": {"tpp": 2, "reasoning_parser": "qwen9"}},
                         "inference": {"engine": "gpu"}}, tmp_path, "cfg.yaml")
    lines = str(e.value).splitlines()
    assert any("cfg.yaml: inference.engine: must be one of sglang, cpu" in x for x in lines)
    assert any("cfg.yaml: eval.top_p: Input should be less than or equal to 1" in x for x in lines)
    # eval's model server, typed: a typo shows at launch, not when eval first runs hours into training
    assert any("cfg.yaml: eval.sglang.tpp: unknown key (a typo?)" in x for x in lines), lines
    assert any("eval.sglang.reasoning_parser" in x and "'qwen9' is not one of SGLang" in x for x in lines), lines
    assert any("cfg.yaml: pool.temperature 0.7 differs from train.rollout_temperature 1.0" in x for x in lines), lines


def test_the_launch_plan_and_the_inference_section_are_parsed_once_and_kept_typed(tmp_path):
    data = {"launch": launch_section(("trainer", ["true"], {"policy": "fail-run"})),
            "inference": {"engine": "cpu", "model": "weights", "port": 31000}}
    config = load_run_config(data, tmp_path, "cfg.yaml", check_launch=True)
    assert config.plan is not None and list(config.plan.roles) == ["trainer"]
    assert config.inference is not None and config.inference.port == 31000 and config.inference.engine == "cpu"
    assert load_run_config(data, tmp_path, "cfg.yaml").plan is None       # launch: checked only when asked
    with pytest.raises(RunConfigError, match="cfg.yaml: has no `launch:` section"):
        load_run_config({"inference": data["inference"]}, tmp_path, "cfg.yaml", check_launch=True)
    bad = tmp_path / "bad.yaml"
    bad.write_text("launch: [unclosed\n")
    r = agentrl("launch", str(bad), "--dry-run")
    assert r.returncode == 2 and f"{bad}: cannot be read as YAML" in r.stderr, r.stderr


def test_the_adapters_settings_are_pool_adapter_and_a_run_made_before_still_reads(tiny_model, tmp_path):
    from agentrl.pool.claimed import adapter_config
    from agentrl.pool.config import load_pool_config

    pool = load_pool_config({"adapter": {"max_new_tokens": 24, "max_context": 4096, "tool_parser": "hermes"}})
    adapter = adapter_config(pool, tiny_model, upstreams=["http://model:1"])
    assert (adapter.max_new_tokens, adapter.max_context, adapter.tool_parser) == (24, 4096, "hermes")
    assert pool.sampling(1.0)["max_new_tokens"] == 24
    # one default per field: the pool's adapter and a bare adapter agree
    assert adapter_config(load_pool_config({}), tiny_model, upstreams=["http://m:1"]).model_dump(
        exclude={"tokenizer", "upstreams"}) == AdapterConfig(tokenizer=tiny_model, upstreams=["http://m:1"]).model_dump(
        exclude={"tokenizer", "upstreams"})
    old = load_pool_config({"max_new_tokens": 24, "max_context": 4096, "model_name": "m"})     # a run.yaml of before
    assert (old.adapter.max_new_tokens, old.adapter.max_context, old.adapter.model_name) == (24, 4096, "m")
    for bad, message in (({"max_new_tokens": 24, "adapter": {"max_new_tokens": 30}}, "max_new_tokens given twice"),
                         ({"adapter": {"max_new_tokens": None}}, "need a per-turn budget"),
                         ({"adapter": {"reasoning_parser": "r9"}}, "pool.adapter: unknown reasoning parser 'r9'"),
                         ({"adapter": {"max_contxt": 9}}, "pool.adapter.max_contxt: unknown key")):
        with pytest.raises(ValueError, match=message):
            load_pool_config(bad)
    config = write(tmp_path / "run.yaml", {"launch": launch_section(("trainer", ["true"], {"policy": "fail-run"})),
                                           "pool": {"max_new_tokens": 24}})
    r = agentrl("launch", str(config), "--dry-run")
    assert r.returncode == 0 and "pool: max_new_tokens now go under pool.adapter:" in r.stderr, r.stderr


@pytest.mark.integration
def test_a_role_that_exits_2_for_its_config_is_not_restarted(tmp_path):
    bad = [sys.executable, "-c", "import sys; print('pool: bad config', file=sys.stderr); sys.exit(2)"]
    trainer = [sys.executable, "-c", "import time; time.sleep(60)"]
    config = write(tmp_path / "run.yaml", {"run_dir": str(tmp_path / "run"), "launch": launch_section(
        ("trainer", trainer, {"policy": "fail-run"}),
        ("pool", bad, {"policy": "restart", "max_restarts": 5, "backoff_s": 0.1}))})
    t0 = time.monotonic()
    r = agentrl("launch", str(config), "--executor", "local")
    assert r.returncode == 2 and time.monotonic() - t0 < 60, r.stdout + r.stderr
    records = {t.role: t for t in read_task_records(RunLayout.open(tmp_path / "run"))}
    assert records["pool"].restarts == 0 and records["pool"].exit_code == 2
    status = agentrl("status", str(tmp_path / "run"))
    assert "a configuration error: not restarted" in status.stdout, status.stdout


def test_routing_replay_is_refused_where_no_route_would_reach_the_trainer(tiny_model, tiny_moe_model, tmp_path):
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "p"}\n')

    def config(model, *, adapter=False, servers=False, backend="torch"):
        return {"train": {"model": str(model), "prompt_data": "prompts.jsonl", "num_rollouts": 1, "backend": backend,
                          "rollout_batch_size": 1, "n_samples_per_prompt": 1, "routing_replay": True},
                "pool": {"adapter": {"return_routed_experts": adapter}},
                "inference": {"engine": "cpu", "model": str(model), "enable_return_routed_experts": servers}}

    with pytest.raises(RunConfigError) as e:
        load_run_config(config(tiny_model), tmp_path, "run.yaml")
    assert str(e.value).splitlines() == [
        f"run.yaml: train.routing_replay: the model at {tiny_model} has no MoE layer (its config.json names no "
        "num_experts and num_experts_per_tok): nothing to replay; set it to false",
        "run.yaml: train.routing_replay needs pool.adapter.return_routed_experts: true (the adapter then asks for "
        "each token's experts and keeps them in the samples)",
        "run.yaml: train.routing_replay needs inference.enable_return_routed_experts: true (the servers then "
        "return each token's experts: SGLang's --enable-return-routed-experts)"]
    for backend in ("torch", "megatron"):       # megatron replays through megatron-core's router hook
        cfg = load_run_config(config(tiny_moe_model, adapter=True, servers=True, backend=backend), tmp_path, "run.yaml")
        assert cfg.train.routing_replay and cfg.pool.adapter.return_routed_experts and cfg.train.backend == backend
    # An MoE over the megatron backend's tensor-parallel ranks: megatron-core needs Transformer Engine for it
    split = config(tiny_moe_model, adapter=True, servers=True, backend="megatron")
    split["train"]["megatron"] = {"tensor_parallel_size": 2}
    with pytest.raises(RunConfigError, match=r"run.yaml: train.megatron.tensor_parallel_size 2 with a "
                                             r"mixture-of-experts model: megatron-core 0.16 trains .* set "
                                             r"tensor_parallel_size: 1"):
        load_run_config(split, tmp_path, "run.yaml")
    dense = config(tiny_model, backend="megatron")
    dense["train"].update(routing_replay=False, megatron={"tensor_parallel_size": 2})
    assert load_run_config(dense, tmp_path, "run.yaml").train.megatron.tensor_parallel_size == 2
