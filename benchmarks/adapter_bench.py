"""Adapter overhead per turn by history length, and turns/s at many concurrent sessions.

(a) overhead: the adapter's own work in one turn (render the chat, tokenize, budget, decode and
    parse the output, record the turn in the trajectory tree), upstream excluded, at histories of
    2k, 8k, 32k and 96k tokens; p50/p95 over --rounds turns, each adding a short reply and tool
    result to a session grown to that size through the adapter itself.
    figure:   the adapter as configured (incremental rendering and tokenization)
    baseline: the same adapter rendering and tokenizing every chat whole (incremental=False)
    Target: overhead at 96k within 1.3x of that at 2k, and <= 3 ms p50.
(b) turns/s: --sessions concurrent OpenAI sessions over real HTTP (`agentrl adapter serve` in its
    own process) against a zero-latency /generate server (another process), each session running
    --turns tool-using turns; figure and baseline as in (a).

ratio = figure / baseline (below 1 is faster for times, above 1 is better for turns/s). The tiny
offline tokenizer and chat template are built under --dir once.

    python -m benchmarks.adapter_bench [--dir DIR] [--rounds 30] [--sessions 64] [--turns 8] [--quick] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import subprocess
import tempfile
import time

import httpx

from agentrl.adapter.service import Adapter, AdapterConfig, load_tokenizer
from agentrl.adapter.upstream import UpstreamPool
from agentrl.adapter.wire import Chat
from agentrl.models.tiny import assistant_text, make_tiny_model
from benchmarks.common import percentile
from hpc.launch.distenv import free_port

ROOT = Path(__file__).resolve().parents[1]

SIZES = (2_000, 8_000, 32_000, 96_000)
TARGET_RATIO_96K_TO_2K = 1.3
TARGET_P50_S = 0.003
TOOLS = [{"type": "function", "function": {"name": name, "description": f"The {name} tool.",
                                           "parameters": {"type": "object", "properties": {
                                               "command": {"type": "string"}, "path": {"type": "string"}}}}}
         for name in ("bash", "read", "edit", "grep")]
REPLY = {"role": "assistant", "content": "", "reasoning_content": "Look at the failing test first.",
         "tool_calls": [{"id": "x", "type": "function", "function": {"name": "bash",
                                                                    "arguments": {"command": "pytest -q tests"}}}]}
TOOL_OUTPUT = "".join(f"tests/test_mod{i}.py::test_case_{i} PASSED  [{i % 100:3d}%]\n" for i in range(40))


def reply_ids(tokenizer) -> list[int]:
    return tokenizer.encode(assistant_text(REPLY), add_special_tokens=False) + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")]


def zero_latency_transport(ids: list[int]) -> httpx.MockTransport:
    body = {"text": "", "output_ids": ids, "meta_info": {
        "finish_reason": {"type": "stop", "matched": ids[-1]}, "weight_version": "0",
        "output_token_logprobs": [[-0.5, t, None] for t in ids]}}
    return httpx.MockTransport(lambda request: httpx.Response(200, json=body))


class SessionDriver:
    """One OpenAI-shaped session driven through Adapter.turn, echoing replies as a CLI does."""

    def __init__(self, adapter: Adapter):
        self.adapter = adapter
        self.session = adapter.sessions.open()
        self.messages = [{"role": "system", "content": "You are a coding agent. " * 20},
                         {"role": "user", "content": "Fix the failing test in this repository."}]
        self.n = 0

    async def turn(self, tool_output: str) -> int:
        result = await self.adapter.turn(self.session, Chat(list(self.messages), TOOLS))
        self.n += 1
        call_id = f"call_{self.n}"
        p = result.parsed
        self.messages.append({"role": "assistant", "content": p.content, "reasoning_content": p.reasoning,
                              "tool_calls": [{"id": call_id, "type": "function",
                                              "function": {"name": c.name, "arguments": c.arguments}}
                                             for c in p.tool_calls]})
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": tool_output})
        return result.prompt_tokens


async def overhead_at(model: Path, size: int, rounds: int, incremental: bool) -> dict:
    cfg = AdapterConfig(tokenizer=model, upstreams=["http://zero"], max_context=200_000, incremental=incremental,
                        verify_render_every=0)
    tokenizer = load_tokenizer(model)
    pool = UpstreamPool(cfg.upstreams, transport=zero_latency_transport(reply_ids(tokenizer)))
    adapter = Adapter(cfg, tokenizer, pool)
    driver = SessionDriver(adapter)
    prompt = 0
    while prompt < size:                    # grow the history through the adapter itself
        prompt = await driver.turn(TOOL_OUTPUT)
    adapter.overhead_s.clear()
    for _ in range(rounds):
        await driver.turn("ok")
    xs = list(adapter.overhead_s)
    return {"size": size, "history_tokens": prompt, "p50_s": percentile(xs, 0.5), "p95_s": percentile(xs, 0.95)}


# ---------------------------------------------------------------- (b) turns/s over HTTP

UPSTREAM_SERVER = r"""
import json, sys
from fastapi import FastAPI
from fastapi.responses import Response
import uvicorn
body = json.dumps(json.load(open(sys.argv[1]))).encode()
app = FastAPI()
@app.post("/generate")
async def generate():
    return Response(body, media_type="application/json")
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
"""


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"adapter_bench: a server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"adapter_bench: {url} did not answer in {timeout_s} s")


async def client_session(client: httpx.AsyncClient, url: str, key: str, turns: int) -> int:
    messages = [{"role": "system", "content": "You are a coding agent. " * 20},
                {"role": "user", "content": "Fix the failing test."}]
    for _ in range(turns):
        r = await client.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                              json={"model": "m", "tools": TOOLS, "messages": messages})
        r.raise_for_status()
        msg = r.json()["choices"][0]["message"]
        messages.append(msg)
        for call in msg.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": TOOL_OUTPUT})
    return turns


def throughput(model: Path, work: Path, sessions: int, turns: int, incremental: bool) -> dict:
    from transformers import AutoTokenizer
    ids = reply_ids(AutoTokenizer.from_pretrained(str(model)))
    reply = work / "reply.json"
    reply.write_text(json.dumps({"text": "", "output_ids": ids, "meta_info": {
        "finish_reason": {"type": "stop", "matched": ids[-1]}, "weight_version": "0",
        "output_token_logprobs": [[-0.5, t, None] for t in ids]}}))
    up_port, ad_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM_SERVER, str(reply), str(up_port)],
                                stderr=subprocess.PIPE)
    cmd = [sys.executable, "-m", "agentrl.cli", "adapter", "serve", "--upstream", f"http://127.0.0.1:{up_port}",
           "--tokenizer", str(model), "--port", str(ad_port), "--open-unknown-keys", "--max-context", "200000"]
    if not incremental:
        cmd.append("--no-incremental")
    adapter = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{ad_port}"
    try:
        wait_http(f"http://127.0.0.1:{up_port}/docs", upstream)
        wait_http(f"{url}/healthz", adapter)

        async def run() -> float:
            limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
            async with httpx.AsyncClient(timeout=300, limits=limits) as client:
                t0 = time.monotonic()
                done = await asyncio.gather(*(client_session(client, url, f"bench-{incremental}-{i}", turns)
                                              for i in range(sessions)))
                return sum(done) / (time.monotonic() - t0)
        rate = asyncio.run(run())
    finally:
        for p in (adapter, upstream):
            p.terminate()
            p.wait(10)
    return {"sessions": sessions, "turns_per_session": turns, "turns_per_s": rate}


# ---------------------------------------------------------------- report

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "agentrl-adapter-bench")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="2k and 8k only, 8 sessions of 3 turns (a smoke run)")
    p.add_argument("--json", action="store_true", help="also print one JSON object of the results")
    args = p.parse_args(argv)
    if min(args.rounds, args.sessions, args.turns) < 1:
        p.error("--rounds, --sessions and --turns must be at least 1")
    sizes = SIZES[:2] if args.quick else SIZES
    sessions, turns = (8, 3) if args.quick else (args.sessions, args.turns)
    args.dir.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(args.dir / "tiny-model", weights=False)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    results: dict = {"overhead": [], "throughput": {}}
    print("(a) adapter overhead per turn, upstream excluded "
          "(figure: incremental render + tokenize; baseline: whole chat every turn)")
    print(f"{'history':>9} {'figure p50':>11} {'p95':>9} {'baseline p50':>13} {'p95':>9} {'ratio':>7}")
    for size in sizes:
        log(f"  growing a session to {size} tokens ...")
        ours = asyncio.run(overhead_at(model, size, args.rounds, True))
        base = asyncio.run(overhead_at(model, size, args.rounds, False))
        results["overhead"].append({"figure": ours, "baseline": base})
        print(f"{ours['history_tokens']:>9} {ours['p50_s'] * 1e3:>9.2f}ms {ours['p95_s'] * 1e3:>7.2f}ms "
              f"{base['p50_s'] * 1e3:>11.2f}ms {base['p95_s'] * 1e3:>7.2f}ms {ours['p50_s'] / base['p50_s']:>7.3f}")
    first, last = results["overhead"][0]["figure"], results["overhead"][-1]["figure"]
    growth = last["p50_s"] / first["p50_s"]
    print(f"    p50 at {last['history_tokens']} tokens / p50 at {first['history_tokens']}: {growth:.2f}x "
          f"(target <= {TARGET_RATIO_96K_TO_2K}x); largest p50 {last['p50_s'] * 1e3:.2f} ms "
          f"(target <= {TARGET_P50_S * 1e3:.0f} ms)")
    results["growth"] = growth

    print(f"(b) turns/s, {sessions} concurrent sessions x {turns} turns over HTTP, zero-latency upstream")
    work = Path(tempfile.mkdtemp(dir=args.dir))
    fig = throughput(model, work, sessions, turns, True)
    base = throughput(model, work, sessions, turns, False)
    results["throughput"] = {"figure": fig, "baseline": base}
    print(f"    figure {fig['turns_per_s']:.1f} turns/s, baseline {base['turns_per_s']:.1f} turns/s, "
          f"ratio {fig['turns_per_s'] / base['turns_per_s']:.2f}")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
