"""One harness session as the pool runs it, for the harness tests: the agent user (uid 1000) in a bwrap
sandbox over a tiny repository whose target.txt says "bug", the host tools directory read-only at
/opt/agentrl/tools, and the adapter (with a scripted upstream) through the sandbox's forwarded port."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripted_upstream import ScriptedUpstream

from agentrl.adapter.serve import AdapterServer
from agentrl.adapter.service import Adapter, AdapterConfig
from agentrl.harness import HarnessRun, get_harness

TASK = "Replace the word bug in target.txt with fixed."


@dataclass
class SandboxedSession:
    proc: Any                      # the CLI's ExecResult
    target: bytes                  # target.txt afterwards
    result: dict[str, Any]         # what finish_session replied
    prompts: list[str]             # the upstream's prompts, decoded
    sampled: list[list[int]]       # the ids the upstream sampled for each step


def run_in_bwrap(harness: str, steps: list[dict], tiny_model: Path, tools_dir: Path,
                 tmp_path: Path) -> SandboxedSession:
    from hpc.sandbox.base import SandboxSpec
    from hpc.sandbox.bwrap import BwrapSandbox

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "target.txt").write_text("bug\n")
    sock = str(tmp_path / "adapter.sock")
    with ScriptedUpstream(tiny_model, steps) as upstream:
        adapter = Adapter(AdapterConfig(tokenizer=tiny_model, upstreams=[upstream.url], max_context=131072))
        with AdapterServer(adapter, uds=sock):
            key = adapter.sessions.open().key
            cmd = get_harness(harness).command(HarnessRun(
                task_text=TASK, prompt_style="instruction", workdir="/testbed", base_url="http://127.0.0.1:8000",
                api_key=key, model="agentrl-tiny", max_new_tokens=3000, max_context=131072))

            async def go():
                spec = SandboxSpec(workdir_source=str(repo), ro_binds={str(tools_dir): "/opt/agentrl/tools"},
                                   adapter_socket=sock)
                async with BwrapSandbox(spec) as sb:
                    for path, data in cmd.files.items():
                        await sb.write_file(path, data, user="agent")
                    r = await sb.exec(cmd.argv, user="agent", cwd="/testbed", env=cmd.env, timeout_s=300)
                    return r, await sb.read_file("/testbed/target.txt")
            proc, target = asyncio.run(asyncio.wait_for(go(), 360))
            return SandboxedSession(proc, target, adapter.sessions.finish(key).to_json(),
                                    [upstream.tokenizer.decode(r["input_ids"]) for r in upstream.requests],
                                    [upstream.output_ids(s) for s in steps])
