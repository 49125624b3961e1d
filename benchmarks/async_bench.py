"""Rollouts ahead of training: trained samples per hour and the trainer's idle share at train.max_staleness k.

A simulation. GPUs are stood in for: a paced model server answers every /generate after a delay drawn
from a seeded lognormal (median --turn-s, sigma --tail: agent sessions with a long tail), and the trainer's
step sleeps --train-step-s. Everything between them is real: for each k, `agentrl launch CONFIG --executor
local --run-dir RUN` starts three roles, and the launcher, ledger, pool, bwrap sandboxes, the builtin
agent, the adapter, the grader, the buffer, and the trainer's loop (agentrl.train.loop: opening rollouts
ahead, closing, staleness, checkpoints, publishing weights, metrics) run as in a real run.

    inference  `python -m benchmarks.async_bench serve`: the paced server. Its replies are rollout_bench's
               scripted policy (a first turn that applies the reference fix of whichever bundled task the
               sandbox holds, then a final answer), so every attempt earns reward 1. Many requests are in
               flight at once (as SGLang batches them); every reply and /model_info carry the server's
               weight_version; /pause_generation ends the generations in flight with finish_reason abort
               (SGLang's default mode: the adapter fails the turn, the agent retries it) and holds new ones
               until /continue_generation; /update_weights_from_disk takes the new version (the trainer's
               export must be a directory; nothing is loaded). Registered in RUN/services, heartbeating.
    trainer    `python -m benchmarks.async_bench train`: agentrl.train.loop.Trainer with a stand-in Policy
               whose one step per rollout sleeps --train-step-s, and whose save and export write small files.
    pool       `agentrl pool`, max_agents = groups x attempts x (max k + 1): every open rollout can run.

Figures, per k, over the steady rollouts (all but the first, whose wait includes the pool's start), from
RUN/metrics.jsonl (one line per rollout, written when the trainer is done with it):
    elapsed      the time from the first rollout's line to the last one's: the steady rollouts' iterations
    samples/h    samples trained (a rollout's samples less those dropped for staleness) / elapsed * 3600
    ratio        samples/h / that of the first k given (k = 0 by default: the synchronous loop)
    idle         sum(wait_s) / elapsed: the share of the time the trainer waited for rollouts to close
                 (wait_s runs from the start of the trainer's iteration to the rollout's close)
    wait s       mean wait_s
    rollout s    mean rollout_s, a rollout's own span from its opening to its close; `rollout/train` =
                 mean rollout_s / mean train_s at k = 0 is the condition the targets assume (about 1)
    lag          mean staleness of the trained tokens (rollouts the policy is ahead of the weights that
                 wrote them); masked: trained tokens past the bound; aborted: generations the server
                 aborted for a weight update (and the agent retried)
    ahead        rollouts r whose successor was opened before r's line was written: the overlap itself
Targets (issue 17): with the k = 0 rollout about as long as a training step, k = 1 gives >= 1.8x the
samples per hour of k = 0, and its trainer idles <= 10% of the time.

    python -m benchmarks.async_bench [--ks 0,1,2] [--rollouts N] [--groups G] [--attempts A]
                                     [--train-step-s T] [--turn-s MEDIAN] [--tail SIGMA] [--seed S]
                                     [--work DIR] [--json]

The defaults (16 attempts a rollout, turns of median 2 s, a 12 s step) make the k = 0 rollout about as
long as a step on 2 idle cores (11-12 s; under other load it takes longer: the table prints the measured
ratio, and --train-step-s sets the step to match), and the whole run take about 6 minutes there. Needs
root, bwrap and nsenter (bwrap sandboxes). Each k's run stays in WORK/runs/k<k> (its logs under logs/);
a failed run names its log.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from typing import Any

import orjson
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from benchmarks.common import stop

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TARGET_RATIO = 1.8          # k = 1's samples/h against k = 0's
TARGET_IDLE = 0.10          # k = 1's idle share
HEARTBEAT_S = 5.0
SIMULATION = ("SIMULATION: a paced model server (lognormal turn delays) and a trainer whose step sleeps stand in "
              "for GPUs; the launcher, ledger, pool, bwrap sandboxes, agent, adapter, grader and training loop "
              "are real")


# ---------------------------------------------------------------- the inference role: a paced scripted server

class PacedModel:
    """The scripted policy's replies, each after a lognormal delay; pause, continue and weight versions as
    SGLang has them. Lives in one event loop."""

    def __init__(self, replies: dict[str, Any], *, turn_s: float, tail: float, seed: int, version: str):
        self.replies, self.turn_s, self.tail = replies, turn_s, tail
        self.rng = random.Random(seed)
        self.version = version
        self.running = asyncio.Event()      # cleared while paused: new generations wait
        self.running.set()
        self.abort = asyncio.Event()        # set (and replaced) by a pause: the generations in flight end
        self.in_flight = 0

    async def generate(self, input_ids: list[int]) -> dict[str, Any]:
        await self.running.wait()
        abort, delay = self.abort, self.rng.lognormvariate(math.log(self.turn_s), self.tail)
        self.in_flight += 1
        try:
            await asyncio.wait_for(abort.wait(), delay)
            return {"text": "", "output_ids": [], "meta_info": {
                "finish_reason": {"type": "abort", "message": "Aborted"}, "weight_version": self.version,
                "prompt_tokens": len(input_ids), "completion_tokens": 0, "output_token_logprobs": []}}
        except asyncio.TimeoutError:
            reply = self.replies["done" if self.replies["tool_response_id"] in input_ids else "call"]
            return {**reply, "meta_info": {**reply["meta_info"], "weight_version": self.version}}
        finally:
            self.in_flight -= 1

    def pause(self) -> int:
        """Abort what is in flight and hold new generations; how many were aborted."""
        aborted = self.in_flight
        self.running.clear()
        self.abort.set()
        self.abort = asyncio.Event()
        return aborted

    def model_info(self) -> dict[str, Any]:
        return {"model_path": "paced", "tokenizer_path": "paced", "is_generation": True,
                "weight_version": self.version}


def paced_app(model: PacedModel) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return model.model_info()

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        reply = await model.generate(orjson.loads(await request.body())["input_ids"])
        return Response(orjson.dumps(reply), media_type="application/json")

    @app.post("/pause_generation")
    async def pause() -> dict[str, str]:
        aborted = model.pause()
        print(f"paused at weight_version {model.version}: aborted {aborted} generations in flight", flush=True)
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def resume() -> dict[str, str]:
        model.running.set()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.post("/update_weights_from_disk")
    async def update(request: Request) -> Response:
        body = await request.json()
        if not Path(body.get("model_path", "")).is_dir():     # the trainer's export must be there; none is loaded
            return JSONResponse({"success": False, "message": f"no directory {body.get('model_path')!r}"}, 400)
        model.version = str(body.get("weight_version", model.version))
        return JSONResponse({"success": True, "message": "Succeeded to update model weights.",
                             "num_paused_requests": 0})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush() -> Response:
        return Response("Cache flushed.\n")

    return app


def serve_main(argv: list[str]) -> int:
    """The inference role: the paced server, registered as inference in the run's registry until SIGTERM."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.async_bench serve")
    ap.add_argument("--replies", type=Path, required=True, help="rollout_bench.policy_replies, as JSON")
    ap.add_argument("--turn-s", type=float, required=True)
    ap.add_argument("--tail", type=float, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import uvicorn

    from agentrl.run_config import role_context
    from hpc import liveness
    from hpc.registry import Registry
    from hpc.runlayout import RunLayout

    ctx = role_context(None, None)
    run = RunLayout.open(ctx.run_dir)
    published = run.published_weights()     # a restarted server serves what was published last

    async def serve() -> None:
        model = PacedModel(orjson.loads(args.replies.read_bytes()), turn_s=args.turn_s, tail=args.tail,
                           seed=args.seed + ctx.env.task_index, version=str(published[0]) if published else "default")
        sock = socket.socket()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(paced_app(model), log_level="warning", access_log=False,
                                               timeout_graceful_shutdown=1))
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if serving.done():
                return await serving
            await asyncio.sleep(0.02)
        registry = Registry(run.services_dir)

        def version() -> int | None:
            return int(model.version) if model.version.isdecimal() else None
        record = registry.register("inference", ctx.env.task_index, host="127.0.0.1", port=sock.getsockname()[1],
                                   weight_version=version())
        print(f"paced server on port {sock.getsockname()[1]}: turns of median {args.turn_s:g} s, "
              f"sigma {args.tail:g}", flush=True)
        try:
            while not serving.done():       # uvicorn ends on SIGTERM
                await asyncio.sleep(HEARTBEAT_S)
                record = await asyncio.to_thread(registry.heartbeat, record, weight_version=version())
                liveness.beat(ctx.env.heartbeat_file)
            await serving
        finally:
            registry.deregister(record)

    for sig in (signal.SIGTERM, signal.SIGINT):    # uvicorn re-raises the signal that stopped it once done
        signal.signal(sig, lambda *_: None)
    asyncio.run(serve())
    return 0


# ---------------------------------------------------------------- the trainer role: the real loop, a paced policy

class PacedPolicy:
    """agentrl.train.policy.Policy without a model: one step sleeps step_s; saved, loaded and exported as
    a few small files."""

    collective_io = False
    dp_rank = 0
    dp_size = 1

    def __init__(self, step_s: float):
        self.step_s, self.steps = step_s, 0

    def train_step(self, batch: Any, plan: Any) -> dict[str, float]:
        time.sleep(self.step_s)
        self.steps += 1
        return {"loss": 0.0}

    def save(self, path: Path) -> None:
        (path / "paced.json").write_text(json.dumps({"steps": self.steps}))

    def load(self, path: Path) -> None:
        self.steps = json.loads((path / "paced.json").read_text())["steps"]

    def export_hf(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps({"paced": True, "steps": self.steps}))

    def fingerprint(self) -> str:
        return "paced"


def train_main(argv: list[str]) -> int:
    """The trainer role: agentrl.train.loop.Trainer as `agentrl train` runs it, with PacedPolicy."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.async_bench train")
    ap.add_argument("--step-s", type=float, required=True, help="seconds per training step")
    args = ap.parse_args(argv)
    from agentrl.logs import setup_logging
    from agentrl.run_config import RunConfigError, role_context
    from agentrl.train.loop import Trainer
    from agentrl.train.policy import Policy
    from hpc.runlayout import RunLayout

    class PacedTrainer(Trainer):
        def make_policy(self) -> Policy:
            return PacedPolicy(args.step_s)

    setup_logging()
    try:
        ctx = role_context(None, None)
        cfg = ctx.config.section("train")
    except RunConfigError as e:
        print(f"async_bench train: {e}", file=sys.stderr)
        return 2
    state = PacedTrainer(RunLayout.open(ctx.run_dir), cfg, liveness_file=ctx.env.heartbeat_file).train()
    print(f"trained {state.iteration} rollouts", flush=True)
    return 0


# ---------------------------------------------------------------- one run per k

def run_config(args: argparse.Namespace, work: Path, k: int) -> dict[str, Any]:
    python = [sys.executable, "-m", "benchmarks.async_bench"]
    env = {"PYTHONPATH": str(ROOT)}      # the role commands import this module, wherever they run
    fail = {"policy": "restart", "max_restarts": 0}     # any role that exits fails the run: figures need all
    return {
        "launch": {"name": f"async-bench-k{k}", "time_limit_min": 120,
                   "partitions": {"cpu": {"nodes": ["cpu1"], "cpus_per_node": 8, "mem_mb": 16000}},
                   "roles": {
                       "inference": {"command": [*python, "serve", "--replies", str(work / "replies.json"),
                                                 "--turn-s", str(args.turn_s), "--tail", str(args.tail),
                                                 "--seed", str(args.seed)],
                                     "partition": "cpu", "mem_per_task_mb": 1000, "env": env, "restart": fail},
                       "pool": {"command": ["agentrl", "pool"], "partition": "cpu", "cpus_per_task": 2,
                                "mem_per_task_mb": 6000, "restart": fail},
                       "trainer": {"command": [*python, "train", "--step-s", str(args.train_step_s)],
                                   "partition": "cpu", "mem_per_task_mb": 2000, "env": env,
                                   "restart": {"policy": "fail-run"}}}},
        "train": {"model": str(work / "tiny-model"), "prompt_data": str(work / "prompts.jsonl"),
                  "num_rollouts": args.rollouts, "rollout_batch_size": args.groups,
                  "n_samples_per_prompt": args.attempts, "max_staleness": k, "seed": args.seed,
                  "rollout_timeout_s": 600, "tracking": {"wandb": "disabled"}},
        "pool": {"harness": "builtin", "max_agents": args.groups * args.attempts * (max(args.ks) + 1),
                 "max_booting": 2, "lease_s": 120, "poll_s": 0.2, "tools_dir": str(work / "tools")},
    }


def launch(args: argparse.Namespace, work: Path, k: int) -> Path:
    """One whole run at max_staleness k, a line per rollout as the trainer records it; its run directory."""
    run, config, log = work / "runs" / f"k{k}", work / f"k{k}.yaml", work / "logs" / f"k{k}.log"
    shutil.rmtree(run, ignore_errors=True)      # a run directory that holds a finished run would end at once
    config.write_text(yaml.safe_dump(run_config(args, work, k), sort_keys=False))
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [str(BIN / "agentrl"), "launch", str(config), "--executor", "local", "--run-dir", str(run)]
    t0, seen = time.monotonic(), 0
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            while proc.poll() is None or seen < len(metrics(run)):
                for m in metrics(run)[seen:]:
                    print(f"  k={k} rollout {m['rollout'] + 1}/{args.rollouts} at {time.monotonic() - t0:5.0f} s: "
                          f"waited {m['wait_s']:.1f} s, trained {m['train_s']:.1f} s, {m['samples']} samples, "
                          f"lag {m.get('staleness/mean', 0):.2f}", file=sys.stderr, flush=True)
                    seen += 1
                time.sleep(0.5)
        finally:      # ^C, a test's timeout: the launcher stops its roles
            stop(proc)
    if proc.returncode or seen != args.rollouts:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise SystemExit(f"async_bench: the run at k={k} failed (exit {proc.returncode}, {seen} of {args.rollouts} "
                         f"rollouts trained); see {log} and {run / 'logs'}; the end of {log}:\n{tail}")
    return run


def metrics(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [m for m in lines if m.get("kind") == "train"]


def figures(run: Path, k: int) -> dict[str, Any]:
    """The figures of one run (module docstring), over its steady rollouts."""
    from hpc.ledger import Ledger

    lines = sorted(metrics(run), key=lambda m: m["rollout"])
    steady = lines[1:]
    elapsed = steady[-1]["time"] - lines[0]["time"]
    trained = sum(m["samples"] - m.get("staleness/dropped_samples", 0) for m in steady)
    tokens_by_lag: dict[int, int] = {}
    for m in steady:
        for key, n in m.items():
            if key.startswith("staleness/tokens_lag_"):
                lag = int(key.rsplit("_", 1)[1])
                tokens_by_lag[lag] = tokens_by_lag.get(lag, 0) + n
    tokens = sum(tokens_by_lag.values())
    ledger = Ledger(run / "ledger")
    opened = {}
    for m in lines:
        gen = ledger.current_generation(m["rollout"])
        opened[m["rollout"]] = ledger.spec(m["rollout"], gen).opened if gen is not None else math.inf
    server_log = (run / "logs" / "inference-0.log").read_text(errors="replace")
    aborted = sum(int(n) for n in re.findall(r"aborted (\d+) generations", server_log))
    return {
        "k": k, "rollouts": len(lines), "steady_rollouts": len(steady), "elapsed_s": round(elapsed, 1),
        "samples_trained": trained, "samples_per_hour": round(trained / elapsed * 3600, 1),
        "idle_share": round(sum(m["wait_s"] for m in steady) / elapsed, 4),
        "wait_s": round(sum(m["wait_s"] for m in steady) / len(steady), 2),
        "iteration_s": round(elapsed / len(steady), 2),
        "rollout_s": round(sum(m["rollout_s"] for m in steady) / len(steady), 2),
        "train_s": round(sum(m["train_s"] for m in steady) / len(steady), 2),
        "lag_mean": round(sum(lag * n for lag, n in tokens_by_lag.items()) / tokens, 3) if tokens else 0.0,
        "tokens_by_lag": {str(lag): n for lag, n in sorted(tokens_by_lag.items())},
        "masked_tokens": sum(m.get("staleness/masked_tokens", 0) for m in steady),
        "aborted_generations": aborted,
        "opened_ahead": sum(1 for m in lines if m["rollout"] + 1 in opened and opened[m["rollout"] + 1] < m["time"]),
        "reward_mean": round(sum(m["reward_mean"] for m in lines) / len(lines), 3),
    }


# ---------------------------------------------------------------- main

def report(levels: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    base = levels[0]
    print(f"\n{args.rollouts} rollouts of {args.groups} groups x {args.attempts} attempts per k; training step "
          f"{args.train_step_s:g} s; turns of median {args.turn_s:g} s, lognormal sigma {args.tail:g}; figures over "
          f"rollouts 2..{args.rollouts} (steady state); ratio against k={base['k']}")
    print(f"{'k':>2}{'samples/h':>11}{'ratio':>7}{'idle':>7}{'iteration s':>13}{'wait s':>8}{'rollout s':>11}"
          f"{'train s':>9}"
          f"{'lag':>6}{'masked':>8}{'aborted':>9}{'ahead':>7}{'reward':>8}")
    for r in levels:
        r["ratio"] = round(r["samples_per_hour"] / base["samples_per_hour"], 3)
        print(f"{r['k']:>2}{r['samples_per_hour']:>11.0f}{r['ratio']:>7.2f}{r['idle_share']:>7.1%}"
              f"{r['iteration_s']:>13.1f}{r['wait_s']:>8.1f}{r['rollout_s']:>11.1f}{r['train_s']:>9.1f}"
              f"{r['lag_mean']:>6.2f}"
              f"{r['masked_tokens']:>8}{r['aborted_generations']:>9}{r['opened_ahead']:>7}{r['reward_mean']:>8.2f}")
    sync = next((r for r in levels if r["k"] == 0), None)
    one = next((r for r in levels if r["k"] == 1), None)
    condition = round(sync["rollout_s"] / sync["train_s"], 3) if sync else None
    targets = {}
    if sync and one:
        gain = one["samples_per_hour"] / sync["samples_per_hour"]
        targets = {f"k=1 samples/h >= {TARGET_RATIO}x k=0": gain >= TARGET_RATIO,
                   f"k=1 idle <= {TARGET_IDLE:.0%}": one["idle_share"] <= TARGET_IDLE}
        print(f"targets, when the k=0 rollout takes about as long as a training step (measured: rollout/train = "
              f"{condition:.2f} at k=0):")
        print(f"  k=1 samples/h >= {TARGET_RATIO}x k=0: {gain:.2f}x, {'met' if gain >= TARGET_RATIO else 'NOT met'}")
        print(f"  k=1 idle <= {TARGET_IDLE:.0%}: {one['idle_share']:.1%}, "
              f"{'met' if one['idle_share'] <= TARGET_IDLE else 'NOT met'}")
    print("idle = time the trainer waited for rollouts / elapsed; lag = mean rollouts between a trained token's "
          "weights and the policy; aborted = generations aborted by weight updates; ahead = rollouts whose "
          "successor opened before they were trained")
    return {"rollout_train_ratio_at_k0": condition, "targets": targets}


def parse_ks(ap: argparse.ArgumentParser, text: str) -> list[int]:
    try:
        ks = [int(p) for p in text.split(",")]
    except ValueError:
        ks = []
    if not ks or any(k < 0 for k in ks) or len(set(ks)) != len(ks):
        ap.error(f"--ks must be distinct integers >= 0 separated by commas, got {text!r}")
    return ks


def bench_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.async_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="0,1,2", help="train.max_staleness of each run (default: %(default)s)")
    ap.add_argument("--rollouts", type=int, default=6, help="rollouts per run (default: %(default)s)")
    ap.add_argument("--groups", type=int, default=4, help="prompt groups per rollout (default: %(default)s)")
    ap.add_argument("--attempts", type=int, default=4, help="attempts per group (default: %(default)s)")
    ap.add_argument("--train-step-s", type=float, default=12.0, help="seconds per training step (default: %(default)s)")
    ap.add_argument("--turn-s", type=float, default=2.0, help="median seconds per model turn (default: %(default)s)")
    ap.add_argument("--tail", type=float, default=0.6, help="sigma of the turns' lognormal (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "async-bench",
                    help="the tiny model, the prompts and one run per k (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="also print one JSON object of the results, last")
    args = ap.parse_args(argv)
    args.ks = parse_ks(ap, args.ks)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # so that the launcher is stopped (launch)
    if args.rollouts < 2:
        ap.error("--rollouts must be at least 2: the first is left out of the figures")
    if min(args.groups, args.attempts) < 1 or min(args.train_step_s, args.turn_s) <= 0 or args.tail < 0:
        ap.error("--groups and --attempts must be positive, --train-step-s and --turn-s above 0, --tail >= 0")
    if os.geteuid() != 0 or shutil.which("bwrap") is None or shutil.which("nsenter") is None:
        ap.error("needs root, bwrap and nsenter (bwrap sandboxes with overlay mounts; make sysdeps)")

    from agentrl.models.tiny import make_tiny_model
    from benchmarks.rollout_bench import bundled_tasks, fix_command, policy_replies

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(work / "tiny-model")      # the tokenizer and chat template the adapter needs
    rows = bundled_tasks()
    (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "replies.json").write_bytes(orjson.dumps(policy_replies(model, fix_command(rows))))
    print(SIMULATION, flush=True)
    print(f"cpus: {os.cpu_count()}, load average before: {os.getloadavg()[0]:.2f}; runs under {work / 'runs'}",
          flush=True)
    levels = []
    for k in args.ks:
        t0 = time.monotonic()
        print(f"k={k}: launching {args.rollouts} rollouts ...", file=sys.stderr, flush=True)
        levels.append(figures(launch(args, work, k), k))
        print(f"k={k}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    out = report(levels, args)
    if args.json:
        print(json.dumps({"benchmark": "async", "simulation": True, "cpus": os.cpu_count(),
                          "params": {k: v for k, v in vars(args).items() if k not in ("work", "json")},
                          "levels": levels, **out}))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    roles = {"serve": serve_main, "train": train_main}
    if argv[:1] and argv[0] in roles:
        return roles[argv[0]](argv[1:])
    return bench_main(argv)


if __name__ == "__main__":
    sys.exit(main())
