"""Training-side figures: schedule quality, trainer throughput, weight publishing.

(a) schedule quality: seeded rollouts of SWE-like trajectory lengths, cut into steps of --attempts
    attempts (an attempt fans out into several samples one time in ten), each step packed into
    micro-batches for dp_size 2, 4 and 8 and max_tokens_per_gpu 65536 and 131072. Per step,
        ratio = largest micro-batch / max(largest sample, step tokens / micro-batches)
    which is at least 1, the largest micro-batch any packing into that many could have.
    figure:   the schedule as built (first-fit decreasing, split, then LPT merge where splitting runs out)
    baseline: the same schedule, its final merge done by joining the two smallest micro-batches
    Both columns show the mean and worst ratio over steps; "merged" is the share of steps whose
    micro-batch count could only be aligned to dp_size by merging, the only place the two differ.
    Length distributions (tokens, clipped to [256, 120000]):
        swe         lognormal, median 20k, sigma 0.8
        swe+failed  the same, with 30% short failed attempts (lognormal, median 2k)
        long        lognormal, median 60k, sigma 0.4 (long-horizon agents near the context limit)

(b) trainer throughput: a seeded rollout (16 attempts of 224 to 896 tokens, a tenth fanned out into
    2 or 3 samples, a quarter of each response a tool result left out of the loss) planned into steps
    of 8 attempts for dp_size 1 and max_tokens_per_gpu 2048, on a Qwen2 of hidden size 256 and 4 layers.
    figure:   TorchPolicy.train_step over the steps
    baseline: a bare torch loop over the same micro-batches, padded alike into the same [batch, length]
              tensors (built beforehand): forward, log_softmax and gather, a masked mean of the
              log-probs as the loss, backward, one AdamW step per step
    tokens/s = the micro-batches' sample tokens / wall time, the median of --rounds passes over all
    steps, after one warm-up step each; the two sides take turns step by step. Target: figure / baseline >= 0.9.

(c) weight publishing, on a Qwen2 of hidden size 512 and 8 layers (109 MB of float32 weights):
    figure:   TorchPolicy.export_hf (safetensors; not fsynced, as export_hf does not) + publish_weights
              to a cpu_server in this process (pause, /update_weights_from_disk, which rebuilds the
              model with from_pretrained, flush, continue, version check, all over HTTP) + a one-token
              /generate: from_pretrained maps the safetensors file and reads it only as weights are
              touched, and that forward pass touches every one
    baseline: the same bytes written to a file beside the export (open, write, fsync), then read back
    MB/s = exported weight bytes / time, the median of --rounds rounds after a warm-up round. Every
    side starts after an untimed os.sync(), so that neither pays for the other's writeback.
    Target: figure / baseline >= 0.7.

ratio = figure / baseline throughout; for (b) and (c) above 1 is better. The models of (b) and (c)
are the tiny offline model's config and tokenizer at a larger size, built once under --dir; torch runs
on 2 threads. --quick shrinks every part (a smoke run).

    python -m benchmarks.train_bench [--parts a,b,c] [--dir DIR] [--rounds 5] [--steps 40] [--attempts 16]
                                     [--seed 0] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentrl.train.schedule import _merge_lpt, _merge_two_smallest, _schedule

PARTS = ("a", "b", "c")
DP_SIZES = (2, 4, 8)
CAPS = (65_536, 131_072)
MIN_TOKENS, MAX_TOKENS = 256, 120_000
FAN_OUT_SHARE = 0.1
DISTRIBUTIONS = ("swe", "swe+failed", "long")
QUICK_STEPS, QUICK_ATTEMPTS = 10, 8

TORCH_THREADS = 2
THROUGHPUT_TARGET = 0.9
PUBLISH_TARGET = 0.7
MB = 1e6


def sample_lengths(distribution: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if distribution == "swe":
        lengths = rng.lognormal(np.log(20_000), 0.8, n)
    elif distribution == "swe+failed":
        lengths = np.where(rng.random(n) < 0.3, rng.lognormal(np.log(2_000), 0.5, n),
                           rng.lognormal(np.log(20_000), 0.8, n))
    elif distribution == "long":
        lengths = rng.lognormal(np.log(60_000), 0.4, n)
    else:
        raise ValueError(f"unknown distribution {distribution!r}")
    return np.clip(lengths, MIN_TOKENS, MAX_TOKENS).astype(int)


def rollout_steps(distribution: str, steps: int, attempts: int, seed: int) -> list[list[int]]:
    """Each step's sample lengths: `attempts` attempts, a tenth of them fanned out into 2 to 5 samples."""
    rng = np.random.default_rng([seed, DISTRIBUTIONS.index(distribution)])
    out = []
    for _ in range(steps):
        fan_outs = np.where(rng.random(attempts) < FAN_OUT_SHARE, rng.integers(2, 6, attempts), 1)
        out.append(sample_lengths(distribution, int(fan_outs.sum()), rng).tolist())
    return out


def step_ratio(lengths: list[int], cap: int, dp_size: int, merge) -> tuple[float, bool]:
    merged = []

    def recording(units, lengths, k):
        merged.append(True)
        return merge(units, lengths, k)

    bins = _schedule(range(len(lengths)), lengths, cap, dp_size, recording)
    largest = max(sum(lengths[i] for i in b) for b in bins)
    return largest / max(max(lengths), sum(lengths) / len(bins)), bool(merged)


def schedule_quality(steps: int, attempts: int, seed: int) -> list[dict]:
    rows = []
    for distribution in DISTRIBUTIONS:
        rollout = rollout_steps(distribution, steps, attempts, seed)
        for dp_size in DP_SIZES:
            for cap in CAPS:
                lpt = [step_ratio(lengths, cap, dp_size, _merge_lpt) for lengths in rollout]
                naive = [step_ratio(lengths, cap, dp_size, _merge_two_smallest)[0] for lengths in rollout]
                ratios = [ratio for ratio, _ in lpt]
                rows.append({"distribution": distribution, "dp_size": dp_size, "max_tokens_per_gpu": cap,
                             "steps": steps, "merged_share": sum(m for _, m in lpt) / steps,
                             "lpt_mean": statistics.fmean(ratios), "lpt_worst": max(ratios),
                             "merge_two_smallest_mean": statistics.fmean(naive),
                             "merge_two_smallest_worst": max(naive)})
    return rows


def print_schedule_quality(rows: list[dict]) -> None:
    print(f"{'distribution':<12} {'dp':>3} {'cap':>7} {'merged':>7} {'LPT mean':>9} {'worst':>6} "
          f"{'2-smallest mean':>16} {'worst':>6}")
    for r in rows:
        print(f"{r['distribution']:<12} {r['dp_size']:>3} {r['max_tokens_per_gpu']:>7} {r['merged_share']:>7.0%} "
              f"{r['lpt_mean']:>9.3f} {r['lpt_worst']:>6.3f} {r['merge_two_smallest_mean']:>16.3f} "
              f"{r['merge_two_smallest_worst']:>6.3f}")
    print("ratio: largest micro-batch / max(largest sample, step tokens / micro-batches); 1 is the best possible")




# ------------------------------------------------------------ (b) and (c): models and workloads

@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    intermediate: int

    @property
    def name(self) -> str:
        return f"qwen2-h{self.hidden}-l{self.layers}-i{self.intermediate}"


@dataclass(frozen=True)
class Workload:
    train_model: ModelShape
    publish_model: ModelShape
    groups: int
    attempts_per_group: int
    max_prompt_tokens: int
    max_response_tokens: int
    global_batch_size: int
    max_tokens_per_gpu: int


FULL = Workload(train_model=ModelShape(256, 4, 768), publish_model=ModelShape(512, 8, 1536), groups=4,
                attempts_per_group=4, max_prompt_tokens=384, max_response_tokens=512, global_batch_size=8,
                max_tokens_per_gpu=2048)
QUICK = Workload(train_model=ModelShape(128, 2, 384), publish_model=ModelShape(128, 2, 384), groups=2,
                 attempts_per_group=2, max_prompt_tokens=64, max_response_tokens=96, global_batch_size=2,
                 max_tokens_per_gpu=512)


def bench_model(root: Path, shape: ModelShape) -> Path:
    """A Qwen2 of `shape` with random weights and the tiny model's tokenizer, built under root once."""
    out = root / shape.name
    if (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl.models.tiny import make_tiny_model
    from agentrl.train.torch_backend import TOKENIZER_FILES

    tiny = make_tiny_model(root / "tiny-model")
    config = Qwen2Config.from_pretrained(str(tiny))
    heads = shape.hidden // 64
    config.update({"hidden_size": shape.hidden, "num_hidden_layers": shape.layers,
                   "intermediate_size": shape.intermediate, "num_attention_heads": heads,
                   "num_key_value_heads": max(1, heads // 2), "layer_types": ["full_attention"] * shape.layers})
    staging = Path(tempfile.mkdtemp(prefix=f".{shape.name}.", dir=root))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            Qwen2ForCausalLM(config).save_pretrained(str(staging), safe_serialization=True)
        for name in TOKENIZER_FILES:
            if (tiny / name).exists() and not (staging / name).exists():
                shutil.copy2(tiny / name, staging / name)
        staging.chmod(0o755)
        try:
            staging.replace(out)   # appears whole; a concurrent build of the same shape may have won the race
        except OSError:
            if not (out / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def describe(shape: ModelShape, module) -> dict:
    return {"hidden_size": shape.hidden, "layers": shape.layers, "intermediate_size": shape.intermediate,
            "parameters": sum(p.numel() for p in module.parameters())}


def train_config(model_dir: Path, root: Path, workload: Workload):
    from agentrl.train.config import TrainConfig

    prompts = root / "prompts.jsonl"      # required to exist; the benchmark draws no prompts
    prompts.touch()
    return TrainConfig(model=model_dir, prompt_data=prompts, num_rollouts=1, rollout_batch_size=workload.groups,
                       n_samples_per_prompt=workload.attempts_per_group,
                       global_batch_size=workload.global_batch_size, max_tokens_per_gpu=workload.max_tokens_per_gpu)


def synchronize(device) -> None:
    """Wait for the device's queued work; train_step does by reading its metrics, a bare loop must ask."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------ (b) trainer throughput

def rollout_samples(workload: Workload, vocab_size: int, seed: int) -> dict:
    """Each group's samples, deterministic in (seed, group, attempt)."""
    from agentrl.sample import Sample

    groups = {}
    for group in range(workload.groups):
        groups[group] = []
        for attempt in range(workload.attempts_per_group):
            rng = np.random.default_rng([seed, group, attempt])
            reward = float(rng.random() < 0.5)
            fan_out = int(rng.integers(2, 4)) if rng.random() < FAN_OUT_SHARE else 1
            for _ in range(fan_out):
                prompt = int(rng.integers(workload.max_prompt_tokens // 4, workload.max_prompt_tokens + 1))
                response = int(rng.integers(workload.max_response_tokens // 4, workload.max_response_tokens + 1))
                mask = np.ones(response, np.uint8)
                tool_result = int(rng.integers(0, response - response // 4))
                mask[tool_result:tool_result + response // 4] = 0
                groups[group].append(Sample(
                    tokens=rng.integers(10, vocab_size - 10, prompt + response), response_length=response,
                    loss_mask=mask, rollout_log_probs=-rng.uniform(0.5, 3.0, response), reward=reward,
                    status="completed", group_index=group, attempt=attempt))
    return groups


def padded_inputs(samples: list):
    """What TorchPolicy feeds a micro-batch: [batch, length] ids and attention mask; and the loss mask of
    the predictions, [batch, length - 1], 1 where a trained response token is predicted."""
    import torch

    length = max(len(s.tokens) for s in samples)
    ids = torch.zeros(len(samples), length, dtype=torch.long)
    attention = torch.zeros(len(samples), length, dtype=torch.long)
    trained = torch.zeros(len(samples), length - 1)
    for row, s in enumerate(samples):
        n = len(s.tokens)
        ids[row, :n] = torch.from_numpy(s.tokens.astype(np.int64))
        attention[row, :n] = 1
        trained[row, n - s.response_length - 1:n - 1] = torch.from_numpy(s.loss_mask.astype(np.float32))
    return ids, attention, trained


def bare_step(model, optimizer, micro_batches: list) -> None:
    import torch

    optimizer.zero_grad(set_to_none=True)
    for ids, attention, trained in micro_batches:
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-(logprobs * trained).sum() / trained.sum().clamp(min=1)).backward()
    optimizer.step()


def trainer_throughput(root: Path, workload: Workload, rounds: int, seed: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.train.batch import plan_steps, rollout_batch
    from agentrl.train.torch_backend import TorchPolicy

    model_dir = bench_model(root, workload.train_model)
    cfg = train_config(model_dir, root, workload)
    policy = TorchPolicy(model_dir, cfg)
    batch = rollout_batch(rollout_samples(workload, policy.module.config.vocab_size, seed))
    plans = plan_steps(batch, global_batch_size=cfg.global_batch_size, max_tokens_per_gpu=cfg.max_tokens_per_gpu,
                       dp_size=1, rank=0)
    micro_batches = [[tuple(t.to(policy.device) for t in padded_inputs([batch.samples[i] for i in mb]))
                      for mb in plan.micro_batches] for plan in plans]
    tokens = sum(batch.lengths[i] for plan in plans for mb in plan.micro_batches for i in mb)
    padded = sum(ids.numel() for step in micro_batches for ids, _, _ in step)

    bare = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(policy.device).train()
    optimizer = torch.optim.AdamW(bare.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    # the first step allocates the optimizer state and faults in the mapped weights, on either side
    policy.train_step(batch, plans[0])
    bare_step(bare, optimizer, micro_batches[0])
    synchronize(policy.device)
    figure, baseline = [], []
    for _ in range(rounds):
        trainer_s = bare_s = 0.0
        for plan, step in zip(plans, micro_batches, strict=True):   # turn by turn, so that a passing load
            t0 = time.perf_counter()                                 # on the machine hits both sides alike
            policy.train_step(batch, plan)
            t1 = time.perf_counter()
            bare_step(bare, optimizer, step)
            synchronize(policy.device)
            t2 = time.perf_counter()
            trainer_s, bare_s = trainer_s + t1 - t0, bare_s + t2 - t1
        figure.append(tokens / trainer_s)
        baseline.append(tokens / bare_s)
    result = {"model": describe(workload.train_model, policy.module), "device": str(policy.device),
              "torch_threads": torch.get_num_threads(), "samples": len(batch.samples), "steps": len(plans),
              "micro_batches": sum(len(plan.micro_batches) for plan in plans), "tokens": tokens,
              "padded_tokens": padded, "rounds": rounds,
              "figure": {"tokens_per_s": statistics.median(figure), "per_round": figure},
              "baseline": {"tokens_per_s": statistics.median(baseline), "per_round": baseline}}
    result["ratio"] = result["figure"]["tokens_per_s"] / result["baseline"]["tokens_per_s"]
    result["target"] = THROUGHPUT_TARGET
    return result


def print_trainer_throughput(r: dict) -> None:
    m = r["model"]
    print(f"(b) trainer throughput: Qwen2 of {m['parameters'] / 1e6:.1f}M parameters (hidden {m['hidden_size']}, "
          f"{m['layers']} layers), on {r['device']} with {r['torch_threads']} torch threads")
    print(f"    {r['samples']} samples in {r['steps']} steps of {r['micro_batches']} micro-batches: {r['tokens']} "
          f"tokens ({r['padded_tokens']} padded); median of {r['rounds']} rounds")
    print(f"    {'':<40} {'tokens/s':>9}")
    print(f"    {'figure    TorchPolicy.train_step':<40} {r['figure']['tokens_per_s']:>9.0f}")
    print(f"    {'baseline  bare torch loop':<40} {r['baseline']['tokens_per_s']:>9.0f}")
    print(f"    ratio {r['ratio']:.3f} (target >= {r['target']}: {'met' if r['ratio'] >= r['target'] else 'missed'})")


# ------------------------------------------------------------ (c) weight publishing

def plain_write_read(path: Path, payload: bytes) -> dict[str, float]:
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        t1 = time.perf_counter()
        os.fsync(f.fileno())
    t2 = time.perf_counter()
    with open(path, "rb") as f:
        read = f.read()
    t3 = time.perf_counter()
    if len(read) != len(payload):
        raise RuntimeError(f"read back {len(read)} of the {len(payload)} bytes written to {path}")
    return {"write_s": t1 - t0, "fsync_s": t2 - t1, "read_s": t3 - t2, "seconds": t3 - t0}


def weight_publishing(root: Path, workload: Workload, rounds: int) -> dict:
    import httpx

    from agentrl.train.publish import publish_weights
    from agentrl.train.torch_backend import TorchPolicy
    from hpc.inference.cpu_server import Engine, ServerThread

    model_dir = bench_model(root, workload.publish_model)
    policy = TorchPolicy(model_dir, train_config(model_dir, root, workload))
    work = Path(tempfile.mkdtemp(prefix="publish-", dir=root))
    first_token = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    figure, baseline = [], []
    try:
        with ServerThread(Engine(model_dir)) as server, httpx.Client(base_url=server.url, timeout=600) as http:
            for version in range(1, rounds + 2):        # version 1 warms both sides up
                export = work / f"v{version}"
                export.mkdir()
                os.sync()
                t0 = time.perf_counter()
                policy.export_hf(export)
                t1 = time.perf_counter()
                publish_weights([server.url], export, version)
                t2 = time.perf_counter()
                http.post("/generate", json=first_token).raise_for_status()
                t3 = time.perf_counter()
                payload = b"".join(p.read_bytes() for p in sorted(export.glob("*.safetensors")))
                os.sync()
                plain = plain_write_read(work / f"plain-v{version}", payload)
                if version > 1:
                    figure.append({"export_s": t1 - t0, "reload_s": t2 - t1, "first_token_s": t3 - t2,
                                   "seconds": t3 - t0})
                    baseline.append(plain)
                # the server still maps this round's file; an unlinked file stays readable to it
                shutil.rmtree(export)
                (work / f"plain-v{version}").unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = len(payload)

    def medians(rows: list[dict[str, float]]) -> dict:
        out = {name: statistics.median(row[name] for row in rows) for name in rows[0]}
        return {"mb_per_s": statistics.median(size / MB / row["seconds"] for row in rows), **out}

    result = {"model": describe(workload.publish_model, policy.module), "weight_bytes": size, "rounds": rounds,
              "figure": medians(figure), "baseline": medians(baseline)}
    result["ratio"] = result["figure"]["mb_per_s"] / result["baseline"]["mb_per_s"]
    result["target"] = PUBLISH_TARGET
    return result


def print_weight_publishing(r: dict) -> None:
    m, fig, base = r["model"], r["figure"], r["baseline"]
    print(f"(c) weight publishing: Qwen2 of {m['parameters'] / 1e6:.1f}M parameters (hidden {m['hidden_size']}, "
          f"{m['layers']} layers), {r['weight_bytes'] / MB:.1f} MB of weights; medians of {r['rounds']} rounds")
    print(f"    {'':<40} {'MB/s':>7} {'seconds':>8}  of which")
    print(f"    {'figure    export_hf + reload + 1 token':<40} {fig['mb_per_s']:>7.0f} {fig['seconds']:>8.3f}  "
          f"export {fig['export_s']:.3f}, reload {fig['reload_s']:.3f}, first token {fig['first_token_s']:.3f}")
    print(f"    {'baseline  write + fsync + read back':<40} {base['mb_per_s']:>7.0f} {base['seconds']:>8.3f}  "
          f"write {base['write_s']:.3f}, fsync {base['fsync_s']:.3f}, read {base['read_s']:.3f}")
    print("    reload: pause, /update_weights_from_disk (the server rebuilds its model from the export), flush, "
          "continue, version check; first token: a one-token /generate, whose forward reads the mapped weights in")
    print(f"    ratio {r['ratio']:.3f} (target >= {r['target']}: {'met' if r['ratio'] >= r['target'] else 'missed'})")


# ------------------------------------------------------------ the command

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated parts to run, of {','.join(PARTS)}")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "agentrl-train-bench",
                    help="where the models of (b) and (c) are built (kept, for later runs) and (c) writes")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds of (b) and (c) (default 5; --quick 1)")
    ap.add_argument("--steps", type=int, default=None,
                    help=f"steps per distribution in (a) (default 40; --quick {QUICK_STEPS})")
    ap.add_argument("--attempts", type=int, default=None,
                    help=f"attempts per step (global_batch_size) in (a) (default 16; --quick {QUICK_ATTEMPTS})")
    ap.add_argument("--seed", type=int, default=0, help="seeds the rollouts of (a) and (b)")
    ap.add_argument("--quick", action="store_true", help="small settings throughout (a smoke run)")
    ap.add_argument("--json", action="store_true", help="end with one JSON object of the figures")
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"unknown part {unknown[0]!r}: the parts are {', '.join(PARTS)}")
    steps = args.steps if args.steps is not None else QUICK_STEPS if args.quick else 40
    attempts = args.attempts if args.attempts is not None else QUICK_ATTEMPTS if args.quick else 16
    rounds = args.rounds if args.rounds is not None else 1 if args.quick else 5
    if min(steps, attempts, rounds) < 1:
        ap.error("--steps, --attempts and --rounds must be at least 1")

    # steps that cannot avoid micro-batches over the cap are what (a) measures; their warnings are noise here
    logging.getLogger("agentrl.train.schedule").setLevel(logging.ERROR)
    figures = {"benchmark": "train", "seed": args.seed}
    if "a" in parts:
        rows = schedule_quality(steps, attempts, args.seed)
        print_schedule_quality(rows)
        figures["schedule"] = {"attempts_per_step": attempts, "results": rows}
    if "b" in parts or "c" in parts:
        import torch
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch.set_num_threads(TORCH_THREADS)
        args.dir.mkdir(parents=True, exist_ok=True)
        workload = QUICK if args.quick else FULL
    if "b" in parts:
        figures["trainer_throughput"] = trainer_throughput(args.dir, workload, rounds, args.seed)
        print_trainer_throughput(figures["trainer_throughput"])
    if "c" in parts:
        figures["weight_publishing"] = weight_publishing(args.dir, workload, rounds)
        print_weight_publishing(figures["weight_publishing"])
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
