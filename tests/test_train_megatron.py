"""The megatron backend against TorchPolicy on the tiny model: on CPU with the CUDA touch points patched
(tests/megatron_cpu.py), and unpatched on a GPU when there is one. Skipped without megatron-core."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from ci import require_module
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from agentrl.sample import Sample
from agentrl.train.batch import RolloutBatch, plan_steps, rollout_batch
from agentrl.train.config import TrainConfig
from agentrl.train.megatron_convert import hf_to_megatron, megatron_to_hf
from agentrl.train.torch_backend import TorchPolicy

pytest_plugins = ["tiny_assets", "megatron_cpu"]
# megatron-core's own deprecation notices, and torch's about the ShardedTensor its checkpoints still use
pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::Warning:megatron"),
              pytest.mark.filterwarnings("ignore:.*ShardedTensor:FutureWarning")]

NO_MEGATRON = "pip install -e '.[megatron]'"


@pytest.fixture(scope="module")
def cfg(tiny_model, tmp_path_factory) -> TrainConfig:
    prompts = tmp_path_factory.mktemp("megatron") / "prompts.jsonl"
    prompts.write_text("")
    # A rollout temperature other than 1, so that both backends' scaling of the logits is compared too.
    return TrainConfig(model=tiny_model, prompt_data=prompts, num_rollouts=1, rollout_batch_size=2,
                       n_samples_per_prompt=2, lr=1e-3, max_tokens_per_gpu=64, rollout_temperature=0.7)


@pytest.fixture(scope="module")
def batch(cfg) -> RolloutBatch:
    """Two groups of two attempts, one fanned out into two samples; varied lengths; masked tool tokens;
    the sampler's log-probs are the initial model's, so the first step starts on-policy."""
    rng = np.random.default_rng(0)
    shapes = [(0, 0, 20, 8), (0, 1, 14, 5), (0, 1, 17, 6), (1, 0, 23, 9), (1, 1, 12, 4)]  # group, attempt, len, resp
    samples = []
    for group, attempt, length, response in shapes:
        mask = np.ones(response)
        mask[1] = 0                                         # a tool's output inside the response
        samples.append(Sample(tokens=rng.integers(0, 4000, length), response_length=response, loss_mask=mask,
                              rollout_log_probs=np.zeros(response), reward=float(attempt ^ group),
                              status="completed", group_index=group, attempt=attempt))
    draft = rollout_batch({g: [s for s in samples if s.group_index == g] for g in (0, 1)})
    torch_policy = TorchPolicy(cfg.model, cfg)
    with torch.no_grad():
        for i, s in enumerate(draft.samples):
            s.rollout_log_probs = torch_policy.response_logprobs(torch_policy.module, draft, [i]).numpy()
    return draft


@pytest.fixture(scope="module")
def untied_cfg(cfg, tmp_path_factory) -> TrainConfig:
    """The tiny model with an output layer of its own, as larger Qwen2 models have."""
    from transformers import Qwen2ForCausalLM

    config = AutoConfig.from_pretrained(cfg.model)
    config.tie_word_embeddings = False
    path = tmp_path_factory.mktemp("untied")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        Qwen2ForCausalLM(config).save_pretrained(str(path))
    return cfg.model_copy(update={"model": path})


def plans(batch: RolloutBatch):
    return plan_steps(batch, global_batch_size=None, max_tokens_per_gpu=64, dp_size=1, rank=0)


def megatron_policy(cfg, **options):
    from agentrl.train.megatron_backend import MegatronOptions, MegatronPolicy

    return MegatronPolicy(cfg.model, cfg, MegatronOptions(**options))


def hf_weights(path: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


# ---------------------------------------------------------------- conversion (no megatron-core needed)

@pytest.mark.parametrize("model", ["tied", "untied"])
def test_conversion_round_trips_and_fuses_in_megatrons_layout(model, request):
    path = request.getfixturevalue({"tied": "cfg", "untied": "untied_cfg"}[model]).model
    hf, state = AutoConfig.from_pretrained(path), hf_weights(path)
    single = hf_to_megatron(state, hf)
    assert ("output_layer.weight" in single) == ("lm_head.weight" in state) == (model == "untied")
    back = megatron_to_hf([single], hf)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)

    # linear_qkv is grouped per query group: [q heads of the group; its k head; its v head]
    d, per_group = 16, 2                    # the tiny model: head_dim 16, 4 query heads over 2 kv heads
    qkv, attn = single["decoder.layers.0.self_attention.linear_qkv.weight"], "model.layers.0.self_attn."
    assert torch.equal(qkv[:per_group * d], state[attn + "q_proj.weight"][:per_group * d])
    assert torch.equal(qkv[per_group * d:(per_group + 1) * d], state[attn + "k_proj.weight"][:d])
    assert torch.equal(qkv[(per_group + 1) * d:(per_group + 2) * d], state[attn + "v_proj.weight"][:d])

    shards = [hf_to_megatron(state, hf, tp_rank=r, tp_size=2) for r in (0, 1)]
    assert shards[1]["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (64, 64)   # one group
    fc1 = shards[1]["decoder.layers.1.mlp.linear_fc1.weight"]    # [gate shard; up shard], each 64 of 128 rows
    assert torch.equal(fc1[:64], state["model.layers.1.mlp.gate_proj.weight"][64:])
    assert torch.equal(fc1[64:], state["model.layers.1.mlp.up_proj.weight"][64:])
    merged = megatron_to_hf(shards, hf)
    assert all(torch.equal(merged[k], state[k]) for k in state)


def test_conversion_refuses_models_it_would_get_wrong():
    from transformers import LlamaConfig, Qwen2Config

    from agentrl.train.megatron_convert import UnsupportedModel, transformer_config_kwargs

    assert transformer_config_kwargs(Qwen2Config(rope_theta=1e6))["num_query_groups"] == 32
    for config, why in [(LlamaConfig(), "only Qwen2"), (Qwen2Config(use_sliding_window=True), "sliding-window"),
                        (Qwen2Config(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "yarn")]:
        with pytest.raises(UnsupportedModel, match=why):
            transformer_config_kwargs(config)


# ---------------------------------------------------------------- the backend on CPU

@pytest.mark.parametrize("model", ["tied", "untied"])
def test_response_logprobs_equal_torch_policys(megatron_cpu, model, request, batch):
    cfg = request.getfixturevalue({"tied": "cfg", "untied": "untied_cfg"}[model])
    policy, reference = megatron_policy(cfg), TorchPolicy(cfg.model, cfg)
    assert ("output_layer.weight" in policy.module.state_dict()) == (model == "untied")
    indices = [0, 1, 3]                     # lengths 20, 14, 23: two rows padded
    with torch.no_grad():
        ours = policy.response_logprobs(policy.model, batch, indices)
        theirs = reference.response_logprobs(reference.model, batch, indices)
    assert ours.shape == theirs.shape == (8 + 5 + 9,)
    assert (ours - theirs).abs().max() < 1e-4


@pytest.mark.parametrize("loss_terms", [{}, {"kl_coef": 0.05, "tis_cap": 2.0}], ids=["clip", "kl-tis"])
def test_train_steps_match_torch_policy_and_lower_the_loss(megatron_cpu, cfg, batch, loss_terms):
    cfg = cfg.model_copy(update=loss_terms)      # kl: a frozen reference model; tis: recomputed old log-probs
    policy, reference = megatron_policy(cfg), TorchPolicy(cfg.model, cfg)
    [plan] = plans(batch)
    assert len(plan.micro_batches) > 1        # gradients accumulate over micro-batches
    ours = [policy.train_step(batch, plan) for _ in range(3)]
    theirs = [reference.train_step(batch, plan) for _ in range(3)]
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys()
        assert all(a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6) for k in a), (a, b)
    losses = [m["loss"] for m in ours]
    assert losses[0] > losses[1] > losses[2]
    assert policy.steps == 3


def test_exported_hf_model_gives_the_megatron_models_logits(megatron_cpu, cfg, batch, tmp_path):
    policy = megatron_policy(cfg)
    policy.train_step(batch, plans(batch)[0])           # weights that differ from the ones it was built from
    policy.export_hf(tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in tmp_path.iterdir()}
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ids = torch.from_numpy(np.stack([s.tokens[:12] for s in batch.samples])).long()
    with torch.no_grad():
        ours, theirs = policy.logits(policy.module, ids), exported(input_ids=ids).logits
    assert not torch.equal(hf_weights(tmp_path)["model.norm.weight"], hf_weights(cfg.model)["model.norm.weight"])
    assert (ours - theirs).abs().max() < 1e-4


def test_save_and_load_restore_model_and_optimizer(megatron_cpu, cfg, batch, tmp_path):
    [plan] = plans(batch)
    trained = megatron_policy(cfg)
    trained.train_step(batch, plan)
    trained.save(tmp_path)
    resumed = megatron_policy(cfg)
    assert resumed.fingerprint() != trained.fingerprint()
    resumed.load(tmp_path)
    assert resumed.fingerprint() == trained.fingerprint()
    # Adam's moments came back too: a fresh optimizer would take a different second step
    assert resumed.train_step(batch, plan) == trained.train_step(batch, plan)
    assert resumed.fingerprint() == trained.fingerprint()


def test_refuses_what_it_cannot_run(megatron_cpu, cfg):
    from agentrl.train.megatron_backend import MegatronOptions, init_model_parallel

    with pytest.raises(ValueError, match="bf16 needs CUDA"):
        megatron_policy(cfg, bf16=True)
    init_model_parallel(MegatronOptions())       # what the fixture set up: nothing to do
    with pytest.raises(ValueError, match=r"parallel sizes \(1, 1, 1\), the options ask for \(2, 1, 1\)"):
        init_model_parallel(MegatronOptions(tensor_parallel_size=2))


# ---------------------------------------------------------------- two CPU ranks: tensor, then data parallel

def test_two_ranks_train_like_one_split_by_tensor_or_by_data(megatron_cpu, cfg, batch, tmp_path):
    [plan] = plans(batch)
    single = megatron_policy(cfg)
    single.train_step(batch, plan)
    expected = single.train_step(batch, plan)
    single.export_hf(tmp_path / "single")

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    ranks = [ctx.Process(target=_two_ranks, args=(r, tmp_path, cfg, batch, results)) for r in (0, 1)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=120)
    assert [p.exitcode for p in ranks] == [0, 0]
    reported = [results.get(timeout=1) for _ in range(4)]
    assert sorted(split for split, _ in reported) == ["data", "data", "tensor", "tensor"]
    for split, metrics in reported:
        assert all(metrics[k] == pytest.approx(expected[k], rel=1e-4, abs=1e-6) for k in expected), (split, metrics)

    theirs = hf_weights(tmp_path / "single")
    for split in ("tensor", "data"):
        ours = hf_weights(tmp_path / split)
        assert ours.keys() == theirs.keys()
        # Reduction orders differ, and Adam magnifies that on tiny gradients: within a tenth of an lr-sized
        # step, where a misplaced shard would be off by the weights' scale (0.02) or a whole step.
        assert max((ours[k] - theirs[k]).abs().max() for k in ours) < 1e-4, split
    # The tensor-parallel checkpoint, resharded to one rank, holds what that run exported.
    resharded = megatron_policy(cfg)
    resharded.load(tmp_path / "checkpoint")
    resharded.export_hf(tmp_path / "resharded")
    ours = hf_weights(tmp_path / "tensor")
    assert all(torch.equal(w, ours[k]) for k, w in hf_weights(tmp_path / "resharded").items())


def _two_ranks(rank: int, tmp_path: Path, cfg: TrainConfig, batch: RolloutBatch, results) -> None:
    from megatron_cpu import cuda_touch_points_on_cpu, model_parallel

    with cuda_touch_points_on_cpu():
        with model_parallel(2, rank=rank, world_size=2, store=dist.FileStore(str(tmp_path / "tp-store"), 2)):
            policy = megatron_policy(cfg, tensor_parallel_size=2)
            [plan] = plans(batch)
            policy.train_step(batch, plan)
            results.put(("tensor", policy.train_step(batch, plan)))
            policy.export_hf(tmp_path / "tensor")
            policy.save(tmp_path / "checkpoint")
        with model_parallel(1, rank=rank, world_size=2, store=dist.FileStore(str(tmp_path / "dp-store"), 2)):
            policy = megatron_policy(cfg)
            [plan] = plan_steps(batch, global_batch_size=None, max_tokens_per_gpu=64, dp_size=2, rank=rank)
            assert plan.micro_batches       # each rank trains a share of the samples
            policy.train_step(batch, plan)
            results.put(("data", policy.train_step(batch, plan)))
            policy.export_hf(tmp_path / "data")


# ---------------------------------------------------------------- a GPU, unpatched

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU tests patch CUDA calls)")
def test_on_a_gpu_without_patches(cfg, batch, tmp_path):
    require_module("megatron.core", "the Megatron GPU tests", NO_MEGATRON)
    from megatron.core import parallel_state as mpu

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mpu.initialize_model_parallel(1, 1)
        policy, reference = megatron_policy(cfg), TorchPolicy(cfg.model, cfg)
        with torch.no_grad():
            ours = policy.response_logprobs(policy.model, batch, [0, 1, 3])
            theirs = reference.response_logprobs(reference.model, batch, [0, 1, 3])
        assert (ours - theirs).abs().max() < 1e-4
        [plan] = plans(batch)
        a, b = policy.train_step(batch, plan), reference.train_step(batch, plan)
        assert all(a[k] == pytest.approx(b[k], rel=1e-3, abs=1e-5) for k in a), (a, b)
        policy.save(tmp_path / "checkpoint")
        resumed = megatron_policy(cfg)
        resumed.load(tmp_path / "checkpoint")
        assert resumed.fingerprint() == policy.fingerprint()
        policy.export_hf(tmp_path / "hf")
        exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).cuda().eval()
        ids = torch.from_numpy(np.stack([s.tokens[:12] for s in batch.samples])).long().cuda()
        with torch.no_grad():
            assert (policy.logits(policy.module, ids) - exported(input_ids=ids).logits).abs().max() < 1e-4
    finally:
        mpu.destroy_model_parallel()
        dist.destroy_process_group()


def test_the_trainer_loop_trains_checkpoints_and_resumes_with_megatron(megatron_cpu, tiny_model, tmp_path):
    trainer_loop(tiny_model, tmp_path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU tests patch CUDA calls)")
def test_the_trainer_loop_on_a_gpu_without_patches(tiny_model, tmp_path):
    require_module("megatron.core", "the Megatron GPU tests", NO_MEGATRON)
    from megatron.core import parallel_state as mpu

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mpu.initialize_model_parallel(1, 1)
        trainer_loop(tiny_model, tmp_path)
    finally:
        mpu.destroy_model_parallel()
        dist.destroy_process_group()


def trainer_loop(tiny_model, tmp_path):
    """Two rollouts trained and checkpointed with the megatron backend, the weights exported, a third resumed."""
    import subprocess
    import sys

    from fake_pool import FakePool

    from agentrl.swe.harbor import BUNDLED_TASKS
    from agentrl.train.config import load_train_config
    from agentrl.train.loop import Trainer
    from hpc.runlayout import RunLayout

    root = Path(__file__).resolve().parents[1]
    prompts = tmp_path / "prompts.jsonl"
    subprocess.run([sys.executable, "-m", "agentrl.cli", "convert", "harbor", str(BUNDLED_TASKS), "--out",
                    str(prompts)], check=True, capture_output=True, cwd=root)
    train = {"model": str(tiny_model), "prompt_data": str(prompts), "backend": "megatron", "num_rollouts": 2,
             "rollout_batch_size": 2, "n_samples_per_prompt": 2, "lr": 1e-3, "max_tokens_per_gpu": 256}
    run = RunLayout.create(tmp_path / "run")
    with FakePool(run.root):
        state = Trainer(run, load_train_config(train)).train()
        assert state.iteration == 2 and run.latest_checkpoint() == 2
        exported = AutoModelForCausalLM.from_pretrained(str(run.checkpoint_dir(2) / "hf"))
        start = AutoModelForCausalLM.from_pretrained(str(tiny_model))
        moved = max((a - b).abs().max().item() for a, b in zip(exported.parameters(), start.parameters(), strict=True))
        assert moved > 0                       # trained weights, not the base model, were exported
        state = Trainer(run, load_train_config({**train, "num_rollouts": 3})).train()    # resumes from iter_2
    assert state.iteration == 3 and state.optimizer_steps == 3
