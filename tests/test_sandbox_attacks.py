"""Attacks on the bwrap sandbox from inside, as the agent and as the grader's root: each must fail.

What an RL policy under training would try, since whatever gets through is rewarded: host root
through grading (device nodes, mounts, sysctls), a daemon that outlives the agent's turn, git
running the agent's code as root, resources beyond the task's limits, and reaching a sibling.
"""

import asyncio
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agentrl.swe import episode
from agentrl.swe.task import TaskSpec
from hpc.sandbox.base import SandboxSpec
from hpc.sandbox.bwrap import BwrapSandbox
from hpc.sandbox.policy import UID_BASE, Limits

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                reason="needs bubblewrap (make sysdeps) and root for the sandbox's uid range")]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 180))


@pytest.fixture
def repo(tmp_path):
    src = tmp_path / "repo"
    src.mkdir()
    (src / "app.py").write_text("print('hello')\n")
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    subprocess.run(["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"],
                   check=True)
    return src


def _spec(**kw) -> TaskSpec:
    return TaskSpec(instance_id="attack", image="host", workdir="/testbed", prompt="p",
                    eval_command=kw.pop("eval_command", "true"), timeouts={"agent_s": 30, "eval_s": 30}, **kw)


HOST_ESCAPE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
dev = os.stat("/proc/self/exe").st_dev          # a device of the host's own disk
out = []
for name, call in [
    ("mknod block", lambda: os.mknod("/tmp/disk", 0o600 | 0o060000, dev)),
    ("mknod char", lambda: os.mknod("/tmp/mem", 0o600 | 0o020000, os.makedev(1, 1))),
    ("mount tmpfs", lambda: libc.mount(b"x", b"/tmp", b"tmpfs", 0, None) == 0 or (_ for _ in ()).throw(
        OSError(ctypes.get_errno(), "mount"))),
    ("core_pattern", lambda: open("/proc/sys/kernel/core_pattern", "w").write("|/tmp/x")),
    ("sysrq", lambda: open("/proc/sysrq-trigger", "w").write("h")),
    ("new user namespace", lambda: libc.unshare(0x10000000) == 0 or (_ for _ in ()).throw(
        OSError(ctypes.get_errno(), "unshare"))),
    ("keyring", lambda: libc.syscall(250, 0, 0, 0, 0, 0) == 0 or (_ for _ in ()).throw(   # keyctl
        OSError(ctypes.get_errno(), "keyctl"))),
]:
    try:
        call()
        out.append(name + ": ESCAPED")
    except OSError as e:
        out.append(name + ": refused " + str(e.errno))
print("\n".join(out))
print("uid", os.getuid(), open("/proc/self/status").read().split("CapBnd:")[1].split()[0])
"""


def test_the_graders_root_has_no_host_privileges(repo):
    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            root = await sb.exec(["python3", "-c", HOST_ESCAPE], user="root")
            agent = await sb.exec(["python3", "-c", HOST_ESCAPE], user="agent")
            return root, agent, sb.init_pid
    root, agent, init = run(go())
    for r in (root, agent):
        assert r.exit_code == 0, r.stderr
        assert b"ESCAPED" not in r.stdout, r.stdout.decode()
        assert r.stdout.count(b"refused") == 7
    assert b"uid 0 " in root.stdout and b"uid 1000 " in agent.stdout
    bounding = int(root.stdout.split()[-1], 16)
    assert not bounding & (1 << 21) and not bounding & (1 << 27)         # no CAP_SYS_ADMIN, no CAP_MKNOD
    # The sandbox's root is an unprivileged host uid, not the host's root.
    assert not Path("/tmp/x").exists()


def test_a_hostile_patch_cannot_reach_the_host_through_grading_in_either_mode(repo, tmp_path):
    """The patch's code runs as root when test.sh imports it: in the agent's sandbox (same) and
    in a fresh one (isolated)."""
    marker = tmp_path / "host-marker"
    evil = (HOST_ESCAPE + f"\nopen({str(marker)!r}, 'w').write('x')\n").encode()
    spec = _spec(eval_command="python3 evil.py > /logs/verifier/probe.txt 2>&1; "
                              "cat /logs/verifier/probe.txt; echo 0 > /logs/verifier/reward.txt")

    async def go(mode):
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            await episode.baseline(sb, spec, restorable=mode == "same")
            await sb.write_file("/testbed/evil.py", evil, user="agent")
            diff = await episode.patch(sb, spec)
            if mode == "same":
                await episode.restore(sb, spec, diff)
                return await episode.grade(sb, spec, {"test.sh": b""})
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as fresh:
            await episode.baseline(fresh, spec)
            await episode.apply_patch(fresh, spec, diff)
            return await episode.grade(fresh, spec, {"test.sh": b""})
    for mode in ("same", "isolated"):
        g = run(go(mode))
        assert b"ESCAPED" not in g.output and g.output.count(b"refused") == 7, g.output.decode()
        assert not marker.exists()          # a host path the sandbox never sees


DAEMON = """(setsid sh -c 'while true; do echo tampered > /testbed/app.py; sleep 0.05; done' \
 >/dev/null 2>&1 < /dev/null &) ; (setsid nohup sh -c 'sleep 1000' >/dev/null 2>&1 &) ; sleep 0.3"""


def test_nothing_the_agent_started_survives_its_turn(repo):
    spec = _spec()

    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            await episode.baseline(sb, spec)
            await episode.run_agent(sb, spec, DAEMON)
            before = await sb.exec(["ps", "-eo", "pid=,args="], user="root")
            diff = await episode.patch(sb, spec)
            after = await sb.exec(["ps", "-eo", "pid=,args="], user="root")
            await sb.exec("echo restored > /testbed/app.py", user="root")
            await asyncio.sleep(0.3)
            return before, diff, after, (await sb.read_file("/testbed/app.py"))
    before, diff, after, content = run(go())
    assert b"sleep 1000" in before.stdout and b"while true" in before.stdout
    rows = [line.split(None, 1) for line in after.stdout.decode().splitlines()]
    # Only the sandbox's init (sleep, as pid 1) and ps itself are left, and zombies init never reaps.
    live = sorted(args for _, args in rows if "<defunct>" not in args)
    assert live == ["ps -eo pid=,args=", "sleep infinity"], live
    assert content == b"restored\n"


def test_git_hooks_and_fsmonitor_the_agent_set_never_run_as_root(repo, tmp_path):
    marker = "/var/lib/agentrl/pwned"
    agent = (f"printf '#!/bin/sh\\ntouch {marker}\\n' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout"
             f" && git config core.fsmonitor 'touch {marker}; true' && git config core.hooksPath .git/hooks")
    # A SWE-bench-style test.sh: git runs in the work tree as root.
    spec = _spec(eval_command="git -c safe.directory='*' status --short >/dev/null; "
                              "git -c safe.directory='*' checkout -q -- app.py; "
                              f"test -e {marker} && echo 1 > /logs/verifier/reward.txt "
                              "|| echo 0 > /logs/verifier/reward.txt")

    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            await episode.baseline(sb, spec, restorable=True)
            r = await episode.run_agent(sb, spec, agent)
            assert r.exit_code == 0, r.stderr
            diff = await episode.patch(sb, spec)
            await episode.restore(sb, spec, diff)
            return diff, await episode.grade(sb, spec, {"test.sh": b""})
    diff, grade = run(go())
    assert diff == b""                  # .git is never part of a patch...
    assert grade.reward == 0.0, grade.output  # ...and what the agent put there is gone before grading


def test_a_verifier_killed_by_the_code_under_test_earns_nothing(repo):
    spec = _spec(eval_command="echo 1 > /logs/verifier/reward.txt; kill -9 $$")

    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            await episode.baseline(sb, spec)
            return await episode.grade(sb, spec, {"test.sh": b""})
    g = run(go())
    assert g.exit_code == -9 and g.reward == 0.0


@pytest.mark.parametrize("limit, attack, failed", [
    (Limits(memory_mb=96), "python3 -c \"b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); print('ok')\"",
     lambda r: r.exit_code != 0 and b"ok" not in r.stdout),
    (Limits(pids=40), "for i in $(seq 200); do sleep 5 & done 2>/dev/null; jobs -p > /tmp/n; wc -l < /tmp/n",
     lambda r: r.stdout.strip() == b"" or int(r.stdout) < 40),
    (Limits(tmp_mb=16), "dd if=/dev/zero of=/tmp/big bs=1M count=100 2>&1",
     lambda r: b"No space left" in r.stdout),
])
def test_each_limit_holds_from_inside_and_a_sibling_carries_on(repo, limit, attack, failed):
    """Storage has tests of its own, in each mode a node supports: tests/test_sandbox_storage.py."""
    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo), limits=limit)) as sb, \
                BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sibling:
            assert not sb.unenforced, sb.unenforced
            r = await sb.exec(attack, timeout_s=60)
            ok = await sibling.exec("python3 app.py")
            again = await sb.exec("echo still here")
            return r, ok, again
    r, ok, again = run(go())
    assert failed(r), (r.exit_code, r.stdout[-500:], r.stderr[-500:])
    assert ok.stdout == b"hello\n" and again.stdout == b"still here\n"


def test_the_cpu_limit_caps_a_busy_loop():
    busy = "python3 -c \"import time, os; t = time.time()\nwhile time.time() - t < 1.5: pass\nprint(os.times().user)\""

    async def go():
        async with BwrapSandbox(SandboxSpec(limits=Limits(cpus=0.25))) as sb:
            return await sb.exec(busy, cwd="/")
    r = run(go())
    assert r.exit_code == 0, r.stderr
    assert float(r.stdout) < 0.75       # 1.5 s of wall time at a quarter of a CPU, with slack


def test_siblings_cannot_see_signal_or_share_uids(repo):
    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as a, \
                BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as b:
            await b.exec("(setsid sleep 777 >/dev/null 2>&1 < /dev/null &); sleep 0.2")
            seen = await a.exec(["ps", "-eo", "args="], user="root")
            await a.exec("kill -9 -1; true", user="root")
            await a.exec("kill -9 -1; true", user="agent")
            alive = await b.exec(["ps", "-eo", "args="])
            return a.uid_base, b.uid_base, seen, alive
    base_a, base_b, seen, alive = run(go())
    assert base_a != base_b and min(base_a, base_b) >= UID_BASE
    assert b"sleep 777" not in seen.stdout and b"sleep 777" in alive.stdout


def test_the_start_cost_stays_small(repo):
    """A hang catcher, not a benchmark (benchmarks/sandbox_bench.py measures)."""
    async def go():
        t = time.monotonic()
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            await sb.exec("true")
        return time.monotonic() - t
    assert run(go()) < 10
