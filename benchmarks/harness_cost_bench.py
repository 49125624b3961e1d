"""What each harness costs a sandbox: wall time and peak resident memory of a one-turn session.

Each harness's own command (argv, env, files: what the pool runs in a sandbox) runs on the host against the
adapter, a scripted model answering "Done." at once, so the figure is the CLI's own start, one request and
its exit; `/usr/bin/time` gives the wall time and the peak resident set of the whole process tree's largest
member (GNU time's %M). Every harness runs --runs times, in turn; the medians are printed beside the builtin
agent's (the baseline: the least a harness can cost), as ratios, with how many such sessions fit in 128 GiB
by memory alone (CPU and the model server's share not counted).

    python -m benchmarks.harness_cost_bench [--runs N] [--harness NAME ...] [--json]

Needs `make clis` (the checkout's .agent-clis) and GNU time.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

from agentrl.adapter.serve import AdapterServer
from agentrl.adapter.service import Adapter, AdapterConfig
from agentrl.harness import HARNESSES, HarnessRun, get_harness
from agentrl.harness.mini_swe_agent import SUBMIT
from agentrl.models.tiny import make_tiny_model

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "builtin"
DEFAULT = ("builtin", "mini_swe_agent_text", "claude_code", "qwen_code", "codex", "opencode", "gemini_cli",
           "openhands")
NODE_GIB = 128
DONE = {"role": "assistant", "content": "Done."}
# mini-swe-agent ends on its submit command, not on a text reply (which is a format error to it)
FINALS = {"mini_swe_agent_text": {"role": "assistant", "content": f"THOUGHT: done.\n\n```mswea_bash_command\n"
                                                                  f"echo {SUBMIT}\n```"},
          "mini_swe_agent": {"role": "assistant", "content": "Done.", "tool_calls": [{
              "id": "x", "type": "function",
              "function": {"name": "bash", "arguments": {"command": f"echo {SUBMIT}"}}}]}}


def one_session(name: str, tools: Path, model: Path, work: Path) -> tuple[float, int]:
    """(wall seconds, peak resident KiB) of one session of harness `name`."""
    sys.path.insert(0, str(ROOT / "tests"))
    from scripted_upstream import ScriptedUpstream

    shutil.rmtree(work, ignore_errors=True)
    (work / "repo").mkdir(parents=True)
    (work / "home").mkdir()
    with ScriptedUpstream(model, [FINALS.get(name, DONE)]) as upstream:
        adapter = Adapter(AdapterConfig(tokenizer=model, upstreams=[upstream.url], max_context=131072))
        with AdapterServer(adapter) as server:
            key = adapter.sessions.open().key
            run = HarnessRun(task_text="Say done.", prompt_style="dataset", workdir=str(work / "repo"),
                             base_url=server.url, api_key=key, model="agentrl-tiny", max_new_tokens=3000,
                             max_context=131072, home=str(work / "home"), tools_dir=str(tools),
                             as_root=os.geteuid() == 0)
            cmd = get_harness(name).command(run)
            for path, data in cmd.files.items():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_bytes(data)
            timing = work / "time.txt"
            proc = subprocess.run(["/usr/bin/time", "-o", str(timing), "-f", "%e %M", *cmd.argv], cwd=work / "repo",
                                  env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **cmd.env},
                                  capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
            adapter.sessions.finish(key)
    if proc.returncode != 0 or len(upstream.requests) != 1:
        raise RuntimeError(f"{name}: exit {proc.returncode}, {len(upstream.requests)} requests: "
                           f"{(proc.stderr or proc.stdout)[-1500:].decode(errors='replace')}")
    wall, kib = timing.read_text().split()[-2:]
    return float(wall), int(kib)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--harness", nargs="+", default=list(DEFAULT), choices=sorted(HARNESSES))
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    if not Path("/usr/bin/time").exists():
        p.error("/usr/bin/time (GNU time) is missing: apt install time")
    names = [BASELINE, *[n for n in args.harness if n != BASELINE]]
    with tempfile.TemporaryDirectory(prefix="harness-cost-") as tmp:
        tools, model = Path(tmp) / "tools", Path(tmp) / "model"
        tools.mkdir()
        make_tiny_model(model)
        for name in names:
            get_harness(name).install(tools)
        samples: dict[str, list[tuple[float, int]]] = {n: [] for n in names}
        for i in range(args.runs):
            for name in names:
                samples[name].append(one_session(name, tools, model, Path(tmp) / "work"))
                print(f"run {i + 1}/{args.runs} {name}: {samples[name][-1][0]:.2f} s, "
                      f"{samples[name][-1][1] / 1024:.0f} MiB", file=sys.stderr, flush=True)
    rows = {n: {"wall_s": statistics.median(w for w, _ in s), "peak_mib": statistics.median(k for _, k in s) / 1024}
            for n, s in samples.items()}
    base = rows[BASELINE]
    for row in rows.values():
        row["wall_ratio"] = row["wall_s"] / base["wall_s"]
        row["memory_ratio"] = row["peak_mib"] / base["peak_mib"]
        row["per_node"] = int(NODE_GIB * 1024 // row["peak_mib"])
    if args.json:
        print(json.dumps({"runs": args.runs, "baseline": BASELINE, "harnesses": rows}, indent=1))
        return 0
    print(f"one-turn session through each harness's own command, median of {args.runs} (baseline: {BASELINE})")
    print(f"  {'harness':<22}{'wall s':>8}{'x base':>8}{'peak MiB':>10}{'x base':>8}{'per 128 GiB':>13}")
    for name, r in rows.items():
        print(f"  {name:<22}{r['wall_s']:>8.2f}{r['wall_ratio']:>8.1f}{r['peak_mib']:>10.0f}"
              f"{r['memory_ratio']:>8.1f}{r['per_node']:>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
