"""`agentrl sft` on the tiny model: the trained tokens become likely, the context tokens are not trained."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agentrl.sample import SAMPLE_CODEC, Sample
from agentrl.train.sft import SFTConfig, load_samples, run_sft, step_batches
from hpc.buffer import write_shard
from hpc.ledger import Claim

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]


def _tokens(model_dir: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(model_dir)).encode(text)


def _demo(model_dir: Path, group: int, reward: float = 1.0) -> Sample:
    """A prompt, then the agent's turn (trained), then a tool result (context), then its next turn (trained)."""
    prompt = _tokens(model_dir, "<|im_start|>user\nfix the bug in pkg/ranges.py<|im_end|>\n<|im_start|>assistant\n")
    turn = _tokens(model_dir, "<tool_call>\n<function=bash>\n<parameter=command>\ncat pkg/ranges.py\n</parameter>\n"
                              "</function>\n</tool_call><|im_end|>\n")
    tool = _tokens(model_dir, "<|im_start|>user\n<tool_response>\nzq xv wk jj\n</tool_response><|im_end|>\n")
    turn2 = _tokens(model_dir, "<|im_start|>assistant\ndone<|im_end|>\n")
    response = turn + tool + turn2
    mask = [1] * len(turn) + [0] * len(tool) + [1] * len(turn2)
    return Sample(tokens=np.array(prompt + response), response_length=len(response), loss_mask=np.array(mask),
                  rollout_log_probs=np.zeros(len(response)), reward=reward, status="completed", group_index=group,
                  attempt=0)


def _mean_logprob(model_dir: Path, sample: Sample, trained: bool) -> float:
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.from_numpy(sample.tokens.astype(np.int64))[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    resp = logp[len(sample.tokens) - sample.response_length - 1:]
    mask = torch.from_numpy(sample.loss_mask.astype(bool))
    return float(resp[mask if trained else ~mask].mean())


def test_sft_makes_the_trained_tokens_likely_and_leaves_the_context_untrained(tiny_model, tmp_path):
    demo = _demo(tiny_model, 0)
    before = (_mean_logprob(tiny_model, demo, True), _mean_logprob(tiny_model, demo, False))
    cfg = SFTConfig(model=tiny_model, out=tmp_path / "sft", epochs=30, lr=3e-3, seed=0)
    history = run_sft(cfg, [demo, _demo(tiny_model, 1, reward=0.0)])
    after = (_mean_logprob(cfg.out, demo, True), _mean_logprob(cfg.out, demo, False))
    assert history[-1]["loss"] < 0.25 * history[0]["loss"]
    assert after[0] > -2 and after[0] - before[0] > 3      # the agent's turns: learnt
    # The tool output is never a target: it stays about as unlikely as it was (a shifted mask would train it).
    assert after[1] < -3 and after[1] - before[1] < 0.5 * (after[0] - before[0])
    out = json.loads((cfg.out / "sft.json").read_text())
    assert out["samples"] == 2 and len(out["history"]) == len(history)
    assert (cfg.out / "config.json").is_file() and (cfg.out / "tokenizer.json").is_file()


def test_min_reward_keeps_only_successes_and_steps_respect_the_token_budget(tiny_model, tmp_path):
    samples = [_demo(tiny_model, g, reward=float(g % 2)) for g in range(4)]
    steps = step_batches(samples, max_tokens=2 * len(samples[0].tokens), rng=__import__("random").Random(0))
    assert sorted(i for s in steps for i in s) == [0, 1, 2, 3] and all(len(s) <= 2 for s in steps)
    cfg = SFTConfig(model=tiny_model, out=tmp_path / "sft", epochs=1, min_reward=1.0)
    run_sft(cfg, samples)
    assert json.loads((cfg.out / "sft.json").read_text())["samples"] == 2
    with pytest.raises(ValueError, match="no sample to train on"):
        run_sft(SFTConfig(model=tiny_model, out=tmp_path / "x", min_reward=5.0), samples)


@pytest.mark.integration
def test_samples_come_from_shards_and_the_cli_refuses_bad_input(tiny_model, tmp_path):
    buf = tmp_path / "buffer"
    for g in range(2):
        write_shard(buf, Claim(rollout_id=0, group=g, attempt=0, generation=0), [_demo(tiny_model, g)], SAMPLE_CODEC)
    assert [s.group_index for s in load_samples([buf])] == [0, 1]

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "agentrl.cli", "sft", *map(str, args)], capture_output=True,
                              text=True, cwd=ROOT, timeout=300)
    r = cli(buf, "--model", tiny_model, "--out", tmp_path / "m", "--epochs", "1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"] >= 1 and "epoch 1/1 step 1: loss" in r.stderr
    (tmp_path / "empty").mkdir()
    r = cli(tmp_path / "empty", "--model", tiny_model, "--out", tmp_path / "m2")
    assert r.returncode == 2 and "holds no samples" in r.stderr
    r = cli(buf, "--model", tmp_path, "--out", tmp_path / "m2")
    assert r.returncode == 2 and "holds no config.json" in r.stderr
    r = cli(buf, "--model", tiny_model, "--out", tmp_path / "m2", "--epochs", "0")
    assert r.returncode == 2 and "--epochs" in r.stderr
