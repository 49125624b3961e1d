"""Routing replay (R3) on a mixture of experts: the sampler/trainer mismatch with replay on, beside off.

The mismatch source is the usual one: the CPU stand-in serves the tiny MoE in bfloat16 (as SGLang
serves), the torch trainer computes in float32. A bfloat16 router picks other experts for some tokens
than a float32 one; replay makes the trainer use the sampler's. Both runs read the same samples:

  1. the tiny MoE (agentrl.models.tiny, Qwen3-MoE: --layers layers, --experts experts, --top-k a token),
     its random weights multiplied by --scale (norms excepted) so that its logits and its experts'
     outputs are as far apart as a trained model's (at the initial 0.02 scale every token's
     log-prob is near -log(vocab) whatever the experts, and nothing could be seen);
  2. --prompts prompts of --prompt-tokens random ids, each sampled --new-tokens tokens by the stand-in
     (hpc.inference.cpu_server.Engine, dtype bfloat16, return_routed_experts), recorded as samples with
     their routes (every fed position's experts);
  3. the trainer's log-probs of the sampled tokens (TorchPolicy.response_logprobs, float32) with
     train.routing_replay off (baseline) and on (figure), and agentrl.train.mismatch's figures of each.

It prints each figure beside its baseline with their ratio (figure / baseline: below 1, replay narrows
the gap), and how many routes the two precisions choose differently (the trainer's own routes against
the recorded ones). docs/train.md, "Routing replay", has a run.

    python -m benchmarks.routing_replay_bench [--dir DIR] [--prompts 16] [--prompt-tokens 64]
                                              [--new-tokens 48] [--scale 8] [--seed 0] [--device cpu] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import shutil
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

FIGURES = ("mismatch_mean", "mismatch_max", "mismatch_k3", "mismatch_over")


@dataclass(frozen=True)
class Options:
    prompts: int = 16
    prompt_tokens: int = 64
    new_tokens: int = 48
    layers: int = 2
    experts: int = 8
    top_k: int = 2
    scale: float = 8.0
    seed: int = 0
    device: str = "cpu"      # the stand-in's forward ("cuda" on a GPU node; the trainer takes the GPU there)


def sharp_moe(work: Path, opts: Options) -> Path:
    """The tiny MoE with its weights scaled (built once per options under `work`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.models import tiny

    base = tiny.make_tiny_model(work / f"tiny-moe-{opts.layers}x{opts.experts}k{opts.top_k}", seed=opts.seed,
                                layers=opts.layers, experts=opts.experts, experts_per_token=opts.top_k)
    out = work / f"{base.name}-x{opts.scale:g}"
    if (out / "model.safetensors").is_file():
        return out
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(opts.scale)
    staging = work / f".{out.name}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(base, staging)
    model.save_pretrained(staging)
    staging.replace(out)
    return out


def sampled(model_dir: Path, opts: Options) -> list:
    """The stand-in's samples in bfloat16, each with its routes (NO_ROUTE on the last, never fed, token)."""
    from agentrl.sample import Sample
    from hpc.inference import routing
    from hpc.inference.cpu_server import Engine
    from hpc.inference.generation import parse_generate

    engine = Engine(model_dir, dtype="bfloat16", return_routed_experts=True, device=opts.device)
    rng = np.random.default_rng(opts.seed)
    samples = []
    for i in range(opts.prompts):
        prompt = rng.integers(10, engine.vocab_size - 16, opts.prompt_tokens).tolist()
        request = parse_generate({"input_ids": prompt, "return_logprob": True, "return_routed_experts": True,
                                  "sampling_params": {"max_new_tokens": opts.new_tokens, "sampling_seed": i,
                                                      "ignore_eos": True}},
                                 vocab_size=engine.vocab_size, context_len=engine.context_len)
        reply = engine.generate(request, engine.gate.epoch)
        out = reply["output_ids"]
        fed = routing.decode(reply["meta_info"]["routed_experts"], rows=len(prompt) + len(out) - 1)
        samples.append(Sample(
            tokens=np.array(prompt + out), response_length=len(out), loss_mask=np.ones(len(out)),
            rollout_log_probs=np.array([lp for lp, _, _ in reply["meta_info"]["output_token_logprobs"]]),
            reward=0.0, status="completed", group_index=i, attempt=0,
            routed_experts=np.vstack([fed, np.full((1, fed.shape[1]), routing.NO_ROUTE)])))
    return samples


def trainer_mismatch(model_dir: Path, samples: list, *, replay: bool) -> dict[str, float]:
    """agentrl.train.mismatch's figures of the trainer's float32 log-probs against the sampler's."""
    import torch

    from agentrl.train.batch import RolloutBatch
    from agentrl.train.config import TrainConfig
    from agentrl.train.mismatch import Mismatch
    from agentrl.train.torch_backend import TorchPolicy

    cfg = TrainConfig(model=model_dir, prompt_data=model_dir / "config.json", num_rollouts=1, rollout_batch_size=1,
                      n_samples_per_prompt=1, routing_replay=replay)
    policy = TorchPolicy(model_dir, cfg)
    batch = RolloutBatch(samples, np.zeros(len(samples)), [(s.group_index, 0) for s in samples])
    with torch.no_grad():
        train = policy.response_logprobs(policy.model, batch, list(range(len(samples))))
    rollout = torch.cat([torch.from_numpy(s.rollout_log_probs) for s in samples])
    return Mismatch.of(train, rollout, torch.ones_like(rollout)).metrics()


def route_differences(model_dir: Path, samples: list) -> dict[str, float]:
    """How often the trainer's own float32 routes differ from the recorded bfloat16 ones: per (position,
    layer) routed, and per sampled token whose predicting position differs in some layer."""
    import torch
    from transformers import AutoModelForCausalLM

    from hpc.inference import routing

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    layers = len(routing.routers(model))
    differ = routed = tokens_off = 0
    for s in samples:
        with torch.no_grad(), routing.capture(model) as calls:
            model(input_ids=torch.from_numpy(s.tokens[None, :-1].astype(np.int64)))
        own = np.sort(routing.captured(calls), axis=-1)
        recorded = np.sort(s.routed_experts[:-1].reshape(len(s.tokens) - 1, layers, -1), axis=-1)
        position_layer = (own != recorded).any(-1)
        differ, routed = differ + int(position_layer.sum()), routed + position_layer.size
        tokens_off += int(position_layer[s.prompt_length - 1:].any(-1).sum())
    return {"routes_differ": differ / routed, "tokens_routed_differently": tokens_off / sum(
        s.response_length for s in samples)}


def measure(work: Path, opts: Options) -> dict[str, Any]:
    t0 = time.monotonic()
    model_dir = sharp_moe(work, opts)
    samples = sampled(model_dir, opts)
    generated = time.monotonic() - t0
    result = {"options": opts.__dict__, "model": str(model_dir), "tokens": sum(s.response_length for s in samples),
              "generate_s": round(generated, 1), "off": trainer_mismatch(model_dir, samples, replay=False),
              "on": trainer_mismatch(model_dir, samples, replay=True), **route_differences(model_dir, samples)}
    result["ratio"] = {k: result["on"][k] / result["off"][k] if result["off"][k] else None for k in FIGURES}
    return result


def report(result: dict[str, Any]) -> str:
    o = result["options"]
    lines = [f"routing replay: tiny MoE ({o['layers']} layers x {o['experts']} experts, {o['top_k']} a token, "
             f"weights x{o['scale']:g}), served in bfloat16, trained in float32; {result['tokens']} sampled tokens "
             f"({o['prompts']} prompts)",
             f"  routes the trainer's float32 router chooses differently: {100 * result['routes_differ']:.2f}% of "
             f"(position, layer); sampled tokens predicted through such a position: "
             f"{100 * result['tokens_routed_differently']:.2f}%",
             f"  {'figure':<16}{'replay on':>12}{'replay off':>13}{'on / off':>10}"]
    for k in FIGURES:
        ratio = result["ratio"][k]
        lines.append(f"  {k:<16}{result['on'][k]:>12.4g}{result['off'][k]:>13.4g}"
                     f"{'n/a' if ratio is None else f'{ratio:.3f}':>10}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.routing_replay_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=Path(".cache/routing-replay"))
    defaults = Options()
    for name in ("prompts", "prompt_tokens", "new_tokens", "layers", "experts", "top_k", "seed"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    p.add_argument("--scale", type=float, default=defaults.scale)
    p.add_argument("--device", default=defaults.device, help="the stand-in's forward: cpu (default) or cuda")
    p.add_argument("--json", action="store_true", help="print the result as JSON too")
    args = p.parse_args(argv)
    opts = Options(**{k: v for k, v in vars(args).items() if k in Options.__dataclass_fields__})
    if min(opts.prompts, opts.prompt_tokens, opts.new_tokens) < 1 or opts.scale <= 0:
        p.error("--prompts, --prompt-tokens and --new-tokens must be at least 1, --scale positive")
    args.dir.mkdir(parents=True, exist_ok=True)
    result = measure(args.dir, opts)
    print(report(result))
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
