"""One harness session, for the harness tests, over a tiny repository whose target.txt says "bug", the adapter
with a scripted upstream behind it:
- run_in_bwrap: as the pool runs it, the agent user (uid 1000) in a bwrap sandbox, the host tools directory
  read-only at /opt/agentrl/tools, the adapter through the sandbox's forwarded port;
- run_on_host: the harness's own command (argv, env, files) on the host, sandbox paths being host paths."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripted_upstream import ScriptedUpstream

from agentrl.adapter.serve import AdapterServer
from agentrl.adapter.service import Adapter, AdapterConfig
from agentrl.harness import HarnessRun, Trajectory, get_harness

TASK = "Replace the word bug in target.txt with fixed."


def make_run(**kw: Any) -> HarnessRun:
    """A run as the pool would make it, for tests of the command a harness builds."""
    base: dict[str, Any] = dict(task_text="Fix the off-by-one in count().", prompt_style="instruction",
                                workdir="/testbed", base_url="http://127.0.0.1:8000", api_key="sess-key",
                                model="agentrl-tiny", max_new_tokens=16000, max_context=200000)
    return HarnessRun(**{**base, **kw})


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


@dataclass
class HostSession:
    proc: subprocess.CompletedProcess
    trajectory: Trajectory         # what the harness read from the CLI's output
    result: dict[str, Any]         # what finish_session replied
    upstream: ScriptedUpstream
    work: Path                     # the repository, afterwards


def run_on_host(harness: str, steps: list, tiny_model: Path, tools_dir: Path, tmp_path: Path, *, task: str = TASK,
                style: str = "instruction", prepare: Callable[[Path, dict[str, str]], None] | None = None,
                **adapter: Any) -> HostSession:
    """`prepare(work, env)` runs after the command's files are written, before the CLI starts; `adapter`
    are AdapterConfig fields."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "target.txt").write_text("bug\n")
    with ScriptedUpstream(tiny_model, steps) as upstream:
        served = Adapter(AdapterConfig(tokenizer=tiny_model, upstreams=[upstream.url], max_context=131072, **adapter))
        with AdapterServer(served) as server:
            key = served.sessions.open().key
            run = HarnessRun(task_text=task, prompt_style=style, workdir=str(work), base_url=server.url,
                             api_key=key, model="agentrl-tiny", max_new_tokens=3000, max_context=131072,
                             home=str(home), tools_dir=str(tools_dir), as_root=os.geteuid() == 0)
            cmd = get_harness(harness).command(run)
            for path, data in cmd.files.items():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_bytes(data)
            if prepare:
                prepare(work, cmd.env)
            env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **cmd.env}
            proc = subprocess.run(cmd.argv, cwd=work, env=env, capture_output=True, timeout=300,
                                  stdin=subprocess.DEVNULL)
            result = served.sessions.finish(key).to_json()
    return HostSession(proc, get_harness(harness).read_trajectory(proc.stdout, proc.stderr), result, upstream, work)


def installed_tools(tmp_path_factory: Any, harness: str) -> Path:
    """A host tools directory filled by the harness's own install (copied from `make clis`), readable by the
    sandbox's agent user."""
    from test_harness import cli_install_source

    cli_install_source()
    tools = tmp_path_factory.mktemp("tools")
    tools.chmod(0o755)
    get_harness(harness).install(tools)
    return tools
