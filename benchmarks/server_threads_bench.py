"""The CPU stand-in's decode speed at one torch thread against torch's default, alone and beside busy cores.

Each side is a fresh process running hpc.inference.cpu_server.Engine.generate on the same request (a
--prompt-tokens prompt, --new-tokens sampled with a fixed seed, stop tokens ignored) on make learn's model
(tools/make_tiny_model.py, 128 wide, 4 layers), --repeats times:
    figure:   threads 1 (hpc.inference.cpu_server.SERVER_THREADS, the server's default since this benchmark)
    baseline: torch's default, one thread per core (what the server ran with before)
each measured idle and with --busy processes spinning beside it (what a pool's sandboxes and agents do
to the server on a small node). ms per generated token, the median of the repeats; ratio = figure /
baseline (below 1 is faster). The tokens each side samples are compared: the same request must give the
same tokens whatever the thread count (a difference is printed, not hidden).

    python -m benchmarks.server_threads_bench [--prompt-tokens 1000] [--new-tokens 64] [--repeats 3]
                                              [--busy N] [--dir DIR] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import statistics
import subprocess

ROOT = Path(__file__).resolve().parents[1]

# One side, in its own process: torch's thread count is the process's.
SIDE = """
import json, sys, time
import torch
from hpc.inference.cpu_server import Engine
from hpc.inference.generation import GenerateRequest, parse_sampling
model, (threads, prompt, new, repeats) = sys.argv[1], map(int, sys.argv[2:6])
torch.set_num_threads(threads or torch.get_num_threads())     # 0: torch's default, one per core
engine = Engine(model)
ids = tuple(range(10, 10 + prompt))
request = GenerateRequest(ids, parse_sampling({"max_new_tokens": new, "ignore_eos": True, "sampling_seed": 7}),
                          True, None)
engine.generate(request, engine.gate.epoch)          # warm-up
times, tokens = [], None
for _ in range(repeats):
    t0 = time.perf_counter()
    out = engine.generate(request, engine.gate.epoch)
    times.append((time.perf_counter() - t0) / new)
    tokens = out["output_ids"]
print(json.dumps({"threads": torch.get_num_threads(), "s_per_token": times, "tokens": tokens}))
"""

SPIN = "import time\nwhile True:\n    sum(range(10000))\n"


def model_dir(work: Path) -> Path:
    path = work / "model-128x4"
    if not (path / "agentrl_tiny.json").exists():
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_tiny_model.py"), str(path), "--hidden-size",
                        "128", "--layers", "4"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


def side(model: Path, threads: int, args: argparse.Namespace, busy: int) -> dict:
    """One side's measurement (threads 0: torch's default) with `busy` spinning processes beside it."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        r = subprocess.run([sys.executable, "-c", SIDE, str(model), str(threads), str(args.prompt_tokens),
                            str(args.new_tokens), str(args.repeats)], capture_output=True, text=True, env=env)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    if r.returncode:
        raise SystemExit(f"server_threads_bench: a side failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="server_threads_bench.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--busy", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                    help="spinning processes beside the server in the busy case (default: cores - 1)")
    ap.add_argument("--dir", type=Path, default=ROOT / ".cache" / "server-threads-bench")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if min(args.prompt_tokens, args.new_tokens, args.repeats, args.busy) < 1:
        ap.error("--prompt-tokens, --new-tokens, --repeats and --busy must be at least 1")
    args.dir.mkdir(parents=True, exist_ok=True)
    model = model_dir(args.dir)
    rows = {}
    for case, busy in (("idle", 0), (f"{args.busy} busy", args.busy)):
        figure, baseline = side(model, 1, args, busy), side(model, 0, args, busy)
        f_ms = statistics.median(figure["s_per_token"]) * 1000
        b_ms = statistics.median(baseline["s_per_token"]) * 1000
        rows[case] = {"figure_ms_per_token": round(f_ms, 2), "baseline_ms_per_token": round(b_ms, 2),
                      "baseline_threads": baseline["threads"], "ratio": round(f_ms / b_ms, 3),
                      "same_tokens": figure["tokens"] == baseline["tokens"]}
    if args.json:
        print(json.dumps({"prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "cases": rows}))
        return 0
    print(f"CPU stand-in, ms per generated token ({args.prompt_tokens}-token prompt, {args.new_tokens} new, "
          f"median of {args.repeats}):")
    for case, r in rows.items():
        print(f"  {case:8s} figure (1 thread) {r['figure_ms_per_token']:7.2f}   baseline ({r['baseline_threads']} "
              f"threads) {r['baseline_ms_per_token']:7.2f}   ratio {r['ratio']:.3f}"
              f"{'' if r['same_tokens'] else '   (the sampled tokens differ)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
