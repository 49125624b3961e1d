"""Rollouts/hour of one pool worker on this machine's cores, and the orchestration overhead of each rollout.

A real PoolWorker (ledger claims, bwrap sandboxes, the builtin agent, its adapter, grading, shards,
commits) runs a batch of attempts at each --concurrency c: max_agents = c, max_booting = min(c,
--max-booting). The policy is scripted and free: a zero-latency /generate server (its own process)
answers an attempt's first turn with one bash call that applies the reference fix of whichever bundled
task it is in (agentrl/swe/bundled_tasks/*/solution/solve.sh, dispatched on a file only that task has) and its
second turn with a final answer. Every attempt must earn reward 1, or the run fails. The attempts cycle through the
bundled tasks in groups of 2; one unmeasured group warms the page cache first.

    rollouts/hour  = committed attempts / batch wall * 3600; batch wall = first claim starts .. last commit returns
    attempt wall   = its claim starts .. its commit returns
    accounted      = boot_s + agent_s + grade_s, as run_attempt records them in every sample's metadata
    overhead       = attempt wall - accounted; overhead share = sum(overhead) / sum(attempt wall)
                     target: <= 3%, on this narrow definition. It covers claiming, dispatch (task loading),
                     the attempt's own bookkeeping (scratch dir, adapter session open/finish, building the
                     samples), sandbox teardown (a span of its own, outside boot_s, agent_s, grade_s), the
                     shard write, the commit, and the hand-offs between the event loop and its threads.
    queue          = waiting at the max_booting / max_agents bounds: not orchestration work. run_attempt
                     starts each clock before it takes the bound, so this lies inside boot_s, agent_s and
                     grade_s; it is measured apart and shown as its own share.
    boot           = boot_s less its queueing: the sandbox's start and the baseline commit. Orchestration in
                     the broad sense, shown beside the overhead and not counted toward the target.
    agent, grade   = agent_s and grade_s less their queueing; the agent includes the /generate round trips
                     (gen) and the adapter's own work per turn (adapter), both also shown apart.

The overhead is broken down per attempt from the spans the worker reports (PoolWorker.on_span: claim,
run_attempt and its phases, the shard write, the commit); the adapter's /generate calls are timed by
wrapping them. cpu busy is the whole machine's, from /proc/stat over the batch. Needs root and
bubblewrap (bwrap sandboxes).

    python -m benchmarks.rollout_bench [--dir DIR] [--concurrency 1,8,32] [--attempts N] [--max-booting 4]
                                       [--quick] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import orjson

from agentrl.adapter.service import Adapter
from agentrl.models.tiny import EOS_TOKEN, assistant_text, make_tiny_model
from agentrl.pool.config import load_pool_config
from agentrl.pool.worker import PoolWorker
from agentrl.prompts.groups import open_rollout
from agentrl.prompts.source import PromptSource, load_prompt_rows
from agentrl.sample import SAMPLE_CODEC
from agentrl.swe.harbor import BUNDLED_TASKS, convert_task, expand_task_dirs
from agentrl.swe.loaded import load_record
from agentrl.train.config import load_train_config
from benchmarks.common import percentile
from hpc.buffer import read_rollout
from hpc.ledger import Claim, Ledger
from hpc.registry import Registry
from hpc.runlayout import RunLayout

TARGET_OVERHEAD_SHARE = 0.03
GROUP_SIZE = 2                   # attempts per prompt group, GRPO's smallest
MAX_NEW_TOKENS = 4096            # PoolConfig's default; the scripted replies must fit
OVERHEAD_PARTS = ("claim", "dispatch", "bookkeeping", "teardown", "shard", "commit", "handoff")
SHARES = ("boot", "queue", "agent", "grade", "overhead")
UNIX_PATH_MAX = 107              # sun_path less its terminating NUL


# ---------------------------------------------------------------- the scripted policy

def bundled_tasks() -> list[dict]:
    """The prompt rows of the bundled tasks (BUNDLED_TASKS/*) that carry a reference solution."""
    rows = [convert_task(d) for d in expand_task_dirs([BUNDLED_TASKS])]
    rows = [r for r in rows if r["metadata"]["harbor"]["solve_sh"]]
    if not rows:
        raise SystemExit(f"rollout_bench: no task under {BUNDLED_TASKS} has solution/solve.sh")
    return rows


def fix_command(rows: list[dict]) -> str:
    """One bash command that fixes any of these tasks: each task's solve.sh, run where a file only it has exists."""
    tasks = [load_record(r) for r in rows]
    seen = [set(t.testbed or ()) for t in tasks]
    parts = []
    for i, task in enumerate(tasks):
        others = set().union(*(s for j, s in enumerate(seen) if j != i))
        marker = min(seen[i] - others, default=None)
        if marker is None:
            raise SystemExit(f"rollout_bench: task {task.spec.instance_id} has no file of its own to be told apart by")
        parts.append(f"if [ -e {shlex.quote(marker)} ]; then\n{task.solution.decode().rstrip()}\nfi")
    return "\n".join(parts)


def policy_replies(model: Path, command: str) -> dict:
    """SGLang /generate replies for the two scripted turns, and the id that tells them apart."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    stop = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    call = {"role": "assistant", "content": "", "reasoning_content": "Apply the fix.",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "bash",
                                                                       "arguments": {"command": command}}}]}
    done = {"role": "assistant", "content": "Fixed.", "reasoning_content": "The fix is in."}
    out = {"tool_response_id": tokenizer.convert_tokens_to_ids("<tool_response>")}
    for name, message in (("call", call), ("done", done)):
        ids = tokenizer.encode(assistant_text(message), add_special_tokens=False) + [stop]
        if len(ids) >= MAX_NEW_TOKENS:
            raise SystemExit(f"rollout_bench: the scripted {name} turn is {len(ids)} tokens, over max_new_tokens")
        out[name] = {"text": "", "output_ids": ids, "meta_info": {
            "finish_reason": {"type": "stop", "matched": stop}, "weight_version": "0",
            "prompt_tokens": 0, "completion_tokens": len(ids),
            "output_token_logprobs": [[-0.5, t, None] for t in ids]}}
        out[f"{name}_tokens"] = len(ids)
    return out


# The first turn's prompt has no tool response yet: answer it with the fix; any later one with the answer.
POLICY_SERVER = r"""
import socket, sys
import orjson, uvicorn

replies = orjson.loads(open(sys.argv[1], "rb").read())
CALL, DONE, TOOL_RESPONSE = orjson.dumps(replies["call"]), orjson.dumps(replies["done"]), replies["tool_response_id"]
HEADERS = [(b"content-type", b"application/json")]


async def app(scope, receive, send):
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    if scope["path"] == "/generate":
        status, reply = 200, DONE if TOOL_RESPONSE in orjson.loads(body)["input_ids"] else CALL
    else:
        status, reply = (200, b"{}") if scope["path"] == "/health" else (404, b"{}")
    await send({"type": "http.response.start", "status": status, "headers": HEADERS})
    await send({"type": "http.response.body", "body": reply})

sock = socket.socket()
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
uvicorn.Server(config).run(sockets=[sock])
"""


def _answering_port(proc: subprocess.Popen, timeout_s: float = 30) -> int | None:
    """The port the policy server printed, once /health answers; None if it died or never answered."""
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        return None
    port, deadline = int(line), time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).raise_for_status()
            return port
        except httpx.HTTPError:
            time.sleep(0.05)
    return None


@contextmanager
def policy_server(replies: Path) -> Iterator[int]:
    """The scripted /generate server in a process of its own, logging beside `replies`; yields its port."""
    with open(replies.with_suffix(".log"), "w+") as errors:
        proc = subprocess.Popen([sys.executable, "-c", POLICY_SERVER, str(replies)], stdout=subprocess.PIPE,
                                stderr=errors, text=True)
        try:
            port = _answering_port(proc)
            if port is None:
                errors.seek(0)
                raise SystemExit(f"rollout_bench: the policy server did not start: {errors.read()[-2000:]}")
            yield port
        finally:
            proc.terminate()
            proc.wait(10)


# ---------------------------------------------------------------- the worker's spans

@dataclass
class Stamps:
    """One attempt's spans (start, end in time.monotonic, as PoolWorker.on_span hears them) and the
    machine's CPU counters at its claim and at its commit."""
    cpu0: tuple[int, int]
    cpu1: tuple[int, int] = (0, 0)
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)

    def start(self, name: str) -> float:
        return self.spans[name][0]

    def end(self, name: str) -> float:
        return self.spans[name][1]

    def seconds(self, name: str) -> float:
        return self.end(name) - self.start(name)

    @property
    def wall(self) -> float:
        return self.end("commit") - self.start("claim")

    @property
    def accounted(self) -> float:
        return self.seconds("boot") + self.seconds("agent") + self.seconds("grade")

    def shares(self) -> dict[str, float]:
        """Seconds of this attempt's wall in each of SHARES; they add up to the wall."""
        queue = {k: self.seconds(f"{k}_queue") for k in ("boot", "agent", "grade")}
        return {"boot": self.seconds("boot") - queue["boot"], "queue": sum(queue.values()),
                "agent": self.seconds("agent") - queue["agent"], "grade": self.seconds("grade") - queue["grade"],
                "overhead": self.wall - self.accounted}

    def overhead(self) -> dict[str, float]:
        """Seconds of this attempt's overhead in each of OVERHEAD_PARTS; they add up to wall - accounted."""
        return {"claim": self.seconds("claim"), "dispatch": self.start("attempt") - self.end("claim"),
                "bookkeeping": self.seconds("attempt") - self.accounted - self.seconds("teardown"),
                "teardown": self.seconds("teardown"), "shard": self.seconds("shard"), "commit": self.seconds("commit"),
                "handoff": (self.start("shard") - self.end("attempt")) + (self.start("commit") - self.end("shard"))}


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)   # idle and iowait are not busy


class SpanLog:
    """PoolWorker.on_span: each attempt's spans, by its claim. The claim's span is an attempt's first; the
    claim's and the commit's are heard in the worker's threads, each of one attempt at a time."""

    def __init__(self) -> None:
        self.attempts: dict[Claim, Stamps] = {}

    def __call__(self, claim: Claim, name: str, start: float, end: float) -> None:
        if name == "claim":
            self.attempts[claim] = Stamps(cpu_times())
        stamps = self.attempts[claim]
        stamps.spans[name] = (start, end)
        if name == "commit":
            stamps.cpu1 = cpu_times()


class TimedWorker(PoolWorker):
    """The pool worker as it is, its spans logged, and the time its adapter waits on /generate summed."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.span_log = SpanLog()
        self.on_span = self.span_log
        self.generation_s = 0.0
        self.the_adapter: Adapter | None = None

    def adapter(self) -> Adapter:
        adapter = super().adapter()
        generate = adapter.pool.generate

        async def timed_generate(*args, **kwargs):
            t0 = time.monotonic()
            try:
                return await generate(*args, **kwargs)
            finally:
                self.generation_s += time.monotonic() - t0
        adapter.pool.generate = timed_generate
        self.the_adapter = adapter
        return adapter


# ---------------------------------------------------------------- one batch

async def run_batch(work: Path, model: Path, prompts: Path, tools: Path, port: int, groups: int,
                    concurrency: int, max_booting: int) -> tuple[TimedWorker, dict]:
    """`groups` x GROUP_SIZE attempts through a fresh run directory and pool worker."""
    (work / "scratch").mkdir(parents=True)
    train = {"model": str(model), "prompt_data": str(prompts), "num_rollouts": 1, "rollout_batch_size": groups,
             "n_samples_per_prompt": GROUP_SIZE, "shuffle": False}
    pool = {"harness": "builtin", "max_agents": concurrency, "max_booting": max_booting, "lease_s": 120,
            "poll_s": 0.1, "adapter": {"max_new_tokens": MAX_NEW_TOKENS}, "tools_dir": str(tools),
            "scratch_dir": str(work / "scratch")}
    run = RunLayout.create(work / "run", config={"train": train, "pool": pool})
    registry = Registry(run.services_dir)
    train_cfg = load_train_config(train)
    source = PromptSource(load_prompt_rows(prompts), rollout_batch_size=groups, shuffle=False)
    open_rollout(Ledger(run.ledger_dir), source, 0, attempts=GROUP_SIZE, temperature=train_cfg.rollout_temperature)
    worker = TimedWorker(run, load_pool_config(pool), train_cfg.model, train_cfg.prompt_data)
    sock = work / "scratch" / f"agentrl-pool-{worker.worker_id}" / "adapter.sock"   # where serve() puts it
    if len(os.fsencode(sock)) > UNIX_PATH_MAX:
        raise SystemExit(f"rollout_bench: the adapter's socket {sock} would be longer than a Unix socket path "
                         f"may be ({UNIX_PATH_MAX} bytes): give a shorter --dir")

    async def keep_registered() -> None:     # the adapter skips servers silent for 30 s
        record = registry.register("inference", 0, host="127.0.0.1", port=port)
        while True:
            await asyncio.sleep(5)
            record = await asyncio.to_thread(registry.heartbeat, record)

    beat = asyncio.create_task(keep_registered())
    try:
        counts = await worker.serve(asyncio.Event(), max_attempts=groups * GROUP_SIZE)
    finally:
        beat.cancel()
    unexpected = {k: v for k, v in counts.items() if k not in ("committed", "samples")}
    rewards = [s.reward for samples in read_rollout(worker.ledger, run.buffer_dir, 0, SAMPLE_CODEC).values()
               for s in samples]
    if unexpected or counts["committed"] != groups * GROUP_SIZE or any(r != 1.0 for r in rewards):
        raise SystemExit(f"rollout_bench: at concurrency {concurrency} the batch did not run clean: {dict(counts)}, "
                         f"rewards {rewards}; the figures would not measure scripted successes")
    return worker, dict(counts)


def summarize(worker: TimedWorker, concurrency: int, max_booting: int) -> dict:
    stamps = list(worker.span_log.attempts.values())
    first, last = min(stamps, key=lambda s: s.start("claim")), max(stamps, key=lambda s: s.end("commit"))
    wall = last.end("commit") - first.start("claim")
    busy, total = (b - a for a, b in zip(first.cpu0, last.cpu1, strict=True))
    walls = [s.wall for s in stamps]
    sum_wall = sum(walls)
    seconds = {k: sum(s.shares()[k] for s in stamps) for k in SHARES}
    overhead = seconds["overhead"] / sum_wall
    n = len(stamps)
    return {
        "concurrency": concurrency, "max_agents": concurrency, "max_booting": max_booting, "attempts": n,
        "batch_wall_s": round(wall, 3), "rollouts_per_hour": round(n / wall * 3600, 1),
        "cpu_busy": round(busy / total, 3) if total else None,
        "attempt_wall_p50_s": round(percentile(walls, 0.5), 3),
        "attempt_wall_p95_s": round(percentile(walls, 0.95), 3),
        "shares": {k: round(v / sum_wall, 4) for k, v in seconds.items()},
        "generation_share": round(worker.generation_s / sum_wall, 4),
        "adapter_share": round(sum(worker.the_adapter.overhead_s) / sum_wall, 4),
        "overhead_ms": {k: round(sum(s.overhead()[k] for s in stamps) / n * 1e3, 2) for k in OVERHEAD_PARTS},
        "overhead_share": round(overhead, 4),
        "overhead_share_without_queue": round(seconds["overhead"] / (sum_wall - seconds["queue"]), 4),
        "broad_overhead_share": round((seconds["overhead"] + seconds["boot"]) / sum_wall, 4),
        "overhead_ratio_to_target": round(overhead / TARGET_OVERHEAD_SHARE, 3),
        "meets_target": overhead <= TARGET_OVERHEAD_SHARE,
    }


# ---------------------------------------------------------------- main

DEFINITIONS = f"""\
definitions (seconds summed over a batch's attempts unless said):
  rollouts/h     committed attempts / batch wall * 3600; batch wall = first claim starts .. last commit returns
  attempt wall   its claim starts .. its commit returns
  overhead       (attempt wall - boot_s - agent_s - grade_s) / attempt wall; target <= {TARGET_OVERHEAD_SHARE:.0%}
                 (claim, dispatch, bookkeeping, sandbox teardown, shard write, commit, hand-offs: table c)
  w/o queue      overhead / (attempt wall - queue): as if no attempt had waited at a bound
  queue          waiting at the max_booting / max_agents bounds: not orchestration (inside boot_s, agent_s, grade_s)
  boot           boot_s less its queue: sandbox start + baseline, orchestration in the broad sense, not in the
                 target; broad = overhead + boot
  agent, grade   agent_s, grade_s less their queue; gen = /generate round trips, adapter = the adapter's own
                 work per turn, both inside agent
  cpu busy       the whole machine's, /proc/stat over the batch (other load on the machine counts too)"""


def _parse_concurrency(ap: argparse.ArgumentParser, text: str) -> list[int]:
    try:
        cs = [int(p) for p in text.split(",")]
    except ValueError:
        cs = []
    if not cs or any(c < 1 for c in cs):
        ap.error(f"--concurrency must be positive integers separated by commas, got {text!r}")
    if len(set(cs)) != len(cs):
        ap.error(f"--concurrency has a repeated value: {text!r}")
    return cs


def report(levels: list[dict]) -> None:
    c0, base = levels[0]["concurrency"], levels[0]["rollouts_per_hour"]
    print(f"\n(a) rollouts/hour; ratio = rollouts/h / that at concurrency {c0}")
    print(f"{'concurrency':>11}{'booting':>8}{'attempts':>9}{'batch s':>9}{'rollouts/h':>11}{'ratio':>7}"
          f"{'cpu busy':>9}{'attempt p50 s':>14}{'p95 s':>7}")
    for r in levels:
        print(f"{r['concurrency']:>11}{r['max_booting']:>8}{r['attempts']:>9}{r['batch_wall_s']:>9.1f}"
              f"{r['rollouts_per_hour']:>11.0f}{r['rollouts_per_hour'] / base:>7.2f}{r['cpu_busy']:>9.0%}"
              f"{r['attempt_wall_p50_s']:>14.2f}{r['attempt_wall_p95_s']:>7.2f}")
    print("\n(b) shares of attempt wall; ratio = overhead / target")
    print(f"{'concurrency':>11}{'boot':>7}{'queue':>7}{'agent':>7}{'(gen':>7}{'adapter)':>9}{'grade':>7}"
          f"{'overhead':>9}{'target':>7}{'ratio':>7}{'w/o queue':>10}{'broad':>7}")
    for r in levels:
        s = r["shares"]
        print(f"{r['concurrency']:>11}{s['boot']:>7.1%}{s['queue']:>7.1%}{s['agent']:>7.1%}"
              f"{r['generation_share']:>7.1%}{r['adapter_share']:>9.1%}{s['grade']:>7.1%}{s['overhead']:>9.2%}"
              f"{TARGET_OVERHEAD_SHARE:>7.0%}{r['overhead_ratio_to_target']:>7.2f}"
              f"{r['overhead_share_without_queue']:>10.2%}{r['broad_overhead_share']:>7.1%}")
    print("\n(c) the overhead, mean ms per attempt: claim = ledger.claim; dispatch = claim returned .. run_attempt")
    print("    starts (task loading); bookkeeping = run_attempt less boot_s, agent_s, grade_s and teardown (scratch")
    print("    dir, adapter session, samples); teardown = sandbox stop (outside boot_s etc.); shard = write_shard;")
    print("    commit = ledger.commit; handoff = the rest (event loop <-> thread hand-offs)")
    print(f"{'concurrency':>11}" + "".join(f"{k:>12}" for k in OVERHEAD_PARTS) + f"{'total':>10}")
    for r in levels:
        o = r["overhead_ms"]
        print(f"{r['concurrency']:>11}" + "".join(f"{o[k]:>12.1f}" for k in OVERHEAD_PARTS)
              + f"{sum(o.values()):>10.1f}")
    missed = [str(r["concurrency"]) for r in levels if not r["meets_target"]]
    print(f"\ntarget: overhead <= {TARGET_OVERHEAD_SHARE:.0%} of attempt wall at every concurrency: "
          + (f"NOT met at concurrency {', '.join(missed)}" if missed else "met"))
    cpus = os.cpu_count() or 1
    if max(r["concurrency"] for r in levels) > cpus:
        print(f"note: {cpus} cores; beyond that the batch is CPU-bound (cpu busy), and attempts queue at the bounds")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "agentrl-rollout-bench",
                    help="the tiny model, the tools and the runs (default: %(default)s)")
    ap.add_argument("--concurrency", default=None, help="max_agents of each batch (default: 1,8,32)")
    ap.add_argument("--attempts", type=int, default=None,
                    help=f"attempts per batch, a multiple of {GROUP_SIZE} (default: 4 x concurrency, at least 32)")
    ap.add_argument("--max-booting", type=int, default=4,
                    help="max_booting of each batch is min(concurrency, this) (default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="concurrency 1,2 with 2 x concurrency attempts (a smoke run)")
    ap.add_argument("--json", action="store_true", help="also print one JSON object of the results, last")
    args = ap.parse_args(argv)
    concurrency = _parse_concurrency(ap, args.concurrency or ("1,2" if args.quick else "1,8,32"))
    if args.attempts is not None and (args.attempts < GROUP_SIZE or args.attempts % GROUP_SIZE):
        ap.error(f"--attempts must be a positive multiple of {GROUP_SIZE}, got {args.attempts}")
    if args.max_booting < 1:
        ap.error("--max-booting must be at least 1")
    if args.dir.exists() and not args.dir.is_dir():
        ap.error(f"--dir {args.dir} is not a directory")
    if os.geteuid() != 0 or shutil.which("bwrap") is None or shutil.which("nsenter") is None:
        ap.error("needs root, bwrap and nsenter (bwrap sandboxes with overlay mounts; make sysdeps)")

    def attempts_at(c: int) -> int:
        if args.attempts is not None:
            return args.attempts
        return 2 * c if args.quick else max(32, 4 * c)

    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    args.dir.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(args.dir / "tiny-model")
    work = Path(tempfile.mkdtemp(prefix="run-", dir=args.dir))
    load = os.getloadavg()[0]
    try:
        rows = bundled_tasks()
        names = [r["metadata"]["instance_id"] for r in rows]
        prompts = work / "prompts.jsonl"
        prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
        replies = policy_replies(model, fix_command(rows))
        (work / "replies.json").write_bytes(orjson.dumps(replies))
        print("one PoolWorker: ledger, bwrap sandboxes, the builtin agent, its adapter, grading, shards, commits")
        print(f"policy: one bash call fixing any of the {len(rows)} bundled tasks ({replies['call_tokens']} tokens), "
              f"then a final answer ({replies['done_tokens']}); zero-latency /generate in its own process")
        print(f"cpus: {os.cpu_count()}  load average before: {load:.2f}  attempts in groups of {GROUP_SIZE}, "
              f"max_agents = concurrency, max_booting = min(concurrency, {args.max_booting})")
        print(DEFINITIONS)
        levels = []
        with policy_server(work / "replies.json") as port:
            t0 = time.monotonic()
            asyncio.run(run_batch(work / "warm-up", model, prompts, args.dir / "tools", port, 1, 1, 1))
            log(f"warm-up: {GROUP_SIZE} attempts in {time.monotonic() - t0:.1f} s (not counted)")
            for c in concurrency:
                n, booting = attempts_at(c), min(c, args.max_booting)
                log(f"concurrency {c}: {n} attempts, max_booting {booting} ...")
                worker, _ = asyncio.run(run_batch(work / f"c{c}", model, prompts, args.dir / "tools", port,
                                                  n // GROUP_SIZE, c, booting))
                levels.append(summarize(worker, c, booting))
                log(f"  {levels[-1]['batch_wall_s']:.1f} s, overhead {levels[-1]['overhead_share']:.2%}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(levels)
    if args.json:
        print(json.dumps({"benchmark": "rollout", "cpus": os.cpu_count(), "load_average": round(load, 2),
                          "quick": args.quick, "tasks": names, "group_size": GROUP_SIZE,
                          "policy_tokens": {"call": replies["call_tokens"], "done": replies["done_tokens"]},
                          "target": {"max_overhead_share": TARGET_OVERHEAD_SHARE}, "levels": levels,
                          "meets_target": all(r["meets_target"] for r in levels)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
