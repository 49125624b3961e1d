"""A bwrap sandbox's disk is disk: writing past storage_mb is ENOSPC, never the OOM killer, and its
memory is what its processes and /tmp take, whatever it writes (docs/sandbox.md, "Storage")."""

import asyncio
import os
import shutil
import subprocess
import time

import pytest
from ci import skip_or_fail

from agentrl.pool.attempt import InfraError, _broken_by_agent
from hpc.images.hostroot import build_host_rootfs
from hpc.sandbox.base import SandboxError, SandboxSpec
from hpc.sandbox.bwrap import BwrapSandbox
from hpc.sandbox.policy import Limits
from hpc.sandbox.storage import disk_unsupported

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                reason="needs bubblewrap (make sysdeps) and root for the sandbox's uid range")]
MIB = 1 << 20
MODES = ["tmpfs", "disk"]


def needs_mode(mode: str) -> None:
    """A disk-backed case needs loop devices and mkfs.ext4: CI's machines have them (a node without them
    has tmpfs only, where the disk cases skip, saying why)."""
    if mode == "disk" and (why := disk_unsupported()) is not None:
        skip_or_fail("the disk-backed storage tests", f"this node cannot back a sandbox with a disk: {why}")
WRITE = ("python3 -c \"import os, sys\nf = open(sys.argv[1], 'wb')\n"
         "for _ in range({mb}): f.write(os.urandom(1 << 20))\" {path}")

# A fork bomb that stops at the first refusal (bash would retry a refused fork for 15 s)
FORKS = ("python3 -c \"import subprocess\nfor _ in range(200):\n    try: subprocess.Popen(['sleep', '30'])\n"
         "    except OSError: print('refused'); break\"")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 180))


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory):
    root = tmp_path_factory.mktemp("image") / "rootfs"
    build_host_rootfs(root)
    return str(root)


@pytest.mark.parametrize("mode", MODES)
def test_writing_past_storage_is_no_space_left_wherever_it_can_write_and_the_sandbox_carries_on(mode, rootfs, tmp_path):
    needs_mode(mode)
    (tmp_path / "repo").mkdir()
    spec = SandboxSpec(rootfs=rootfs, workdir_source=str(tmp_path / "repo"), storage=mode,
                       limits=Limits(memory_mb=256, storage_mb=48), root_dirs=("/var/lib/agentrl",))
    # the work tree, HOME, and the image's own layer (where grading keeps its baseline)
    places = [("/testbed/big", "agent"), ("/home/agent/big", "agent"), ("/var/lib/agentrl/big", "root")]

    async def go():
        async with BwrapSandbox(spec) as sb:
            out = []
            for path, user in places:
                r = await sb.exec(WRITE.format(mb=80, path=path), user=user, cwd="/")
                out.append((r, (await sb.usage()).limits_hit()))
                await sb.exec(["rm", "-f", path], user="root", cwd="/")
            return sb.storage, out, await sb.exec("echo still here"), await sb.usage()
    storage, out, again, after = run(go())
    assert storage["backing"] == mode
    for (path, _), (r, hit) in zip(places, out, strict=True):
        assert r.exit_code != 0 and b"No space left on device" in r.stderr, (path, r.exit_code, r.stderr[-300:])
        assert hit == ("storage",), path
    assert again.stdout == b"still here\n" and after.alive and after.limits_hit() == () and not after.oom_kills


@pytest.mark.parametrize("mode", ["disk", "tmpfs"])
def test_storage_above_memory_holds_what_is_written_on_disk_not_in_ram(mode, tmp_path):
    """Harbor's defaults give more storage than memory. On a disk image 640 MiB go to a work tree
    in a 256 MiB sandbox and its RAM stays where it was; on tmpfs (the fallback) the same write
    meets the OOM killer and leaves the memory held, the cost the fallback's warning names. Either
    way the killer spares init (head's few pages are no bigger than init's: it once took init)."""
    needs_mode(mode)
    (tmp_path / "repo").mkdir()
    spec = SandboxSpec(workdir_source=str(tmp_path / "repo"), storage=mode,
                       limits=Limits(memory_mb=256, storage_mb=1024))

    async def go():
        async with BwrapSandbox(spec) as sb:
            before = await sb.usage()
            r = await sb.exec("head -c 640M /dev/zero > /testbed/big && stat -c %s /testbed/big")
            return before, r, await sb.usage(), await sb.exec("echo still here")
    before, r, after, again = run(go())
    assert after.alive
    if mode == "disk":
        assert r.exit_code == 0 and int(r.stdout) == 640 * MIB, r.stderr[-300:]
        assert after.ram <= before.ram * 1.1 + 8 * MIB, (before, after)       # page cache is not held
        assert after.limits_hit() == () and again.stdout == b"still here\n"
    else:
        assert r.exit_code in (-9, 137) and after.oom_kills      # 137: bash saying its child was killed
        assert after.exhausted() == ("memory",)         # held by the tmpfs: grading goes elsewhere


def test_its_processes_get_the_memory_limit_less_what_tmp_holds_and_the_oom_killer_spares_init(tmp_path):
    (tmp_path / "repo").mkdir()
    spec = SandboxSpec(workdir_source=str(tmp_path / "repo"), limits=Limits(memory_mb=320, storage_mb=512))
    take = ("python3 -c \"import sys; b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b'x' * len(b[::4096]); "
            "print('ok')\" {mb}")

    async def go():
        async with BwrapSandbox(spec) as sb:
            await sb.exec(WRITE.format(mb=100, path="/tmp/held") + " && " + WRITE.format(mb=300, path="/testbed/d"))
            fits = await sb.exec(take.format(mb=320 - 100 - 40))    # 40 MiB: the interpreter's own
            beyond = await sb.exec(take.format(mb=320 - 100 + 20))
            return fits, beyond, await sb.exec("echo still here"), await sb.usage()
    fits, beyond, again, usage = run(go())
    assert fits.stdout == b"ok\n", fits.stderr[-300:]
    assert beyond.exit_code == -9 and b"ok" not in beyond.stdout
    # the killer took the allocating process, never init: the sandbox goes on
    assert again.stdout == b"still here\n" and usage.alive and usage.oom_kills >= 1
    assert usage.limits_hit() == ("memory",) and 100 * MIB <= usage.shmem < 110 * MIB


def test_a_sandbox_that_fails_with_no_limit_hit_is_an_infrastructure_failure_and_with_one_the_agents(tmp_path):
    """The attempt's classification (agentrl.pool.attempt): by the kernel's counters, not the error."""
    async def go():
        async with BwrapSandbox(SandboxSpec(limits=Limits(pids=24))) as sb:
            await sb.exec(FORKS, cwd="/")
            try:
                raise SandboxError("a command failed")
            except SandboxError as e:
                agents = await _broken_by_agent(sb, e, "the agent's turn", 0.0)
        async with BwrapSandbox(SandboxSpec()) as sb:
            os.kill(sb.supervisor_pid, 9)       # the node's doing: its supervisor killed
            with pytest.raises(SandboxError) as died:
                await sb.exec("true", cwd="/")
            assert not (await sb.usage()).alive
            with pytest.raises(InfraError, match="sandbox, during the agent's turn"):
                await _broken_by_agent(sb, died.value, "the agent's turn", 0.0)
        return agents
    agents = run(go())
    assert agents.exit_code == -9 and b"at the sandbox's pids limit" in agents.stderr


def test_no_loop_device_outlives_its_sandbox(tmp_path):
    needs_mode("disk")
    async def go():
        spec = SandboxSpec(storage="disk", scratch_dir=str(tmp_path), limits=Limits(storage_mb=64))
        async with BwrapSandbox(spec) as stopped, BwrapSandbox(spec) as killed:
            during = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
            await stopped.exec("true", cwd="/")
            os.kill(killed.supervisor_pid, 9)
            for _ in range(200):        # its mount namespace goes with its last process
                if subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout.count(str(tmp_path)) < 2:
                    break
                await asyncio.sleep(0.05)
        return during
    during = run(go())
    assert during.count(str(tmp_path)) == 2                 # each disk image was on a loop device...
    for _ in range(200):     # the kernel clears an autoclear device once its last user is gone: not at once under load
        after = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
        if str(tmp_path) not in after:
            break
        time.sleep(0.05)
    # ...detached with the sandbox's mounts. Only this test's images are looked at: the other
    # xdist worker's pools attach and detach their own devices meanwhile.
    assert str(tmp_path) not in after
    assert not os.listdir(tmp_path)
