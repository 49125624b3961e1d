"""The bubblewrap runtime for real: isolation, copy-on-write, timeouts, nothing outliving a sandbox."""

import asyncio
import http.server
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from http_fixtures import Hello, UnixHTTPServer, serve
from proc_table import orphans_named

from hpc.sandbox.base import SandboxError, SandboxSpec
from hpc.sandbox.bwrap import BwrapSandbox
from hpc.sandbox.bwrap_args import bwrap_argv, mount_points
from hpc.sandbox.supervisor import FORK_SERVER_NAME, SUPERVISOR_NAME

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                reason="needs bubblewrap (make sysdeps) and root for overlay mounts")]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


@pytest.fixture
def repo(tmp_path):
    src = tmp_path / "repo"
    src.mkdir()
    (src / "app.py").write_text("print('hello from the sandbox')\n")
    return src


def sandbox_processes(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def test_exec_users_cwd_env_and_no_host_environment(repo, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")

    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo), env={"TASK": "t1"})) as sb:
            r = await sb.exec("id -u; pwd; echo $TASK; echo ${SECRET_TOKEN:-none}; python3 app.py")
            root = await sb.exec(["id", "-u"], user="root")
            fail = await sb.exec("echo oops >&2; exit 7")
            return r, root, fail
    r, root, fail = run(go())
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().split("\n")[:5] == ["1000", "/testbed", "t1", "none", "hello from the sandbox"]
    assert root.stdout == b"0\n"
    assert (fail.exit_code, fail.stderr) == (7, b"oops\n")


def test_files_round_trip_and_copy_on_write(repo):
    payload = os.urandom(1 << 20)

    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as a, \
                BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as b:
            await a.write_file("/testbed/data.bin", payload, user="agent")
            await a.exec("echo changed > app.py")
            got = await a.read_file("/testbed/data.bin")
            other = await b.exec("cat app.py; ls")
            return got, other
    got, other = run(go())
    assert got == payload
    assert other.stdout.decode() == "print('hello from the sandbox')\napp.py\n"   # b saw nothing of a
    assert sorted(p.name for p in repo.iterdir()) == ["app.py"]                  # the source is untouched
    assert (repo / "app.py").read_text() == "print('hello from the sandbox')\n"


def test_the_image_is_read_only_and_host_files_stay_out(repo):
    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            write_usr = await sb.exec("touch /usr/x", user="root")
            shadow = await sb.exec("cat /etc/shadow", user="root")
            home = await sb.exec("ls /root /home")
            return write_usr, shadow, home
    write_usr, shadow, home = run(go())
    assert write_usr.exit_code != 0 and b"Read-only" in write_usr.stderr
    assert shadow.exit_code != 0           # the host's /etc is not there
    assert home.stdout.split() == [b"/home:", b"agent", b"/root:"]


def test_timeout_kills_the_whole_process_group(repo):
    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            r = await sb.exec("sleep 300 & sleep 301 & wait", timeout_s=1)
            left = await sb.exec("ps -eo args", user="root")
            return r, left
    r, left = run(go())
    assert r.timed_out and r.duration_s < 10
    assert b"sleep 30" not in left.stdout, left.stdout


def test_no_process_outlives_the_sandbox(repo):
    async def go():
        sb = BwrapSandbox(SandboxSpec(workdir_source=str(repo)))
        await sb.start()
        try:
            # setsid escapes the process group that exec stops; the pause lets it happen before exec returns
            await sb.exec("setsid sleep 4242 > /dev/null 2>&1 < /dev/null & sleep 0.3")
            assert sandbox_processes("sleep 4242")
        finally:
            await sb.stop()
    run(go())
    assert not sandbox_processes("sleep 4242")
    assert not [m for m in Path("/proc/mounts").read_text().splitlines() if f"lowerdir={repo}" in m]


def test_a_killed_owner_takes_its_sandboxes_with_it(repo, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = tmp_path / "owner.py"
    script.write_text(f"""
import asyncio, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from hpc.sandbox.base import SandboxError, SandboxSpec
from hpc.sandbox.bwrap import BwrapSandbox
async def main():
    sb = BwrapSandbox(SandboxSpec(workdir_source={str(repo)!r}, scratch_dir={str(scratch)!r}))
    await sb.start()
    await sb.exec("setsid sleep 4343 > /dev/null 2>&1 < /dev/null & sleep 0.3")
    print("ready", flush=True)
    await asyncio.sleep(300)
asyncio.run(main())
""")
    # Other runs' sandboxes (a benchmark beside the tests, another test worker) may come and go meanwhile: only
    # a supervisor or fork server left without its owner (reparented to pid 1) counts.
    forks_before, orphans_before = orphans_named(FORK_SERVER_NAME), orphans_named(SUPERVISOR_NAME)
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    assert owner.stdout.readline() == b"ready\n"
    assert sandbox_processes("sleep 4343")
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 10
    while sandbox_processes("sleep 4343") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sandbox_processes("sleep 4343")
    # Its copy-on-write mounts lived in the sandbox's own mount namespace: gone with it.
    assert not [m for m in Path("/proc/mounts").read_text().splitlines() if f"lowerdir={repo}" in m]
    # Its supervisor saw the owner go (its control socket closed) and removed everything else.
    deadline = time.monotonic() + 10
    while (list(scratch.iterdir()) or orphans_named(SUPERVISOR_NAME) - orphans_before
           or orphans_named(FORK_SERVER_NAME) - forks_before) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(scratch.iterdir())
    assert not orphans_named(SUPERVISOR_NAME) - orphans_before
    assert not orphans_named(FORK_SERVER_NAME) - forks_before   # its fork server went too


@pytest.mark.alone      # any sandbox that starts on the machine reaps the dead one's cgroups, another test's too
def test_a_killed_supervisor_takes_its_sandbox_with_it_and_the_next_one_reaps(repo, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    async def go():
        sb = BwrapSandbox(SandboxSpec(workdir_source=str(repo), scratch_dir=str(scratch)))
        await sb.start()
        await sb.exec("setsid sleep 4444 > /dev/null 2>&1 < /dev/null & sleep 0.3")
        os.kill(sb.supervisor_pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while sandbox_processes("sleep 4444") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not sandbox_processes("sleep 4444")
        with pytest.raises(SandboxError, match="supervisor exited"):
            await sb.exec("true")
        left = sorted(p.name for p in scratch.iterdir())
        cgroups = _sandbox_cgroups(sb.supervisor_pid)
        await sb.stop()
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo), scratch_dir=str(scratch))):
            reaped = _sandbox_cgroups(sb.supervisor_pid)
        return left, cgroups, reaped
    left, cgroups, reaped = run(go())
    assert len(left) == 1            # the owner is alive, so it removes it at stop
    assert not list(scratch.iterdir())
    # Its cgroups (pids, at least: every sandbox has a pids limit) outlived it; the next sandbox removed them.
    assert cgroups and not reaped


def _sandbox_cgroups(supervisor_pid: int) -> list[Path]:
    from hpc.sandbox.cgroups import PREFIX, ROOT, own_cgroups
    own = own_cgroups(Path("/proc/self/cgroup").read_text())
    bases = [ROOT / c / p.lstrip("/") for c, p in own.items() if c and (ROOT / c).is_dir()]
    return [d for b in bases if b.is_dir() for d in b.iterdir() if d.name.startswith(f"{PREFIX}{supervisor_pid}.")]


def test_network_only_the_own_adapter_is_reachable(repo, tmp_path):
    host_http = serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello))
    host_port = host_http.server_address[1]
    sock_a, sock_b = str(tmp_path / "a.sock"), str(tmp_path / "b.sock")
    serve(UnixHTTPServer(sock_a, Hello))
    serve(UnixHTTPServer(sock_b, Hello))
    for sock in (sock_a, sock_b):
        os.chmod(sock, 0o666)   # the agent (uid 1000) connects to it: the adapter makes its sockets so
    curl = "python3 -c 'import sys,urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).read().decode())'"

    async def go():
        spec_a = SandboxSpec(workdir_source=str(repo), adapter_socket=sock_a, adapter_port=8001)
        spec_b = SandboxSpec(workdir_source=str(repo), adapter_socket=sock_b, adapter_port=8002)
        async with BwrapSandbox(spec_a) as a, BwrapSandbox(spec_b) as b:
            own = await a.exec(f"{curl} http://127.0.0.1:8001/v1/messages")
            via_socket = await a.exec("python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); "
                                      "s.connect('/run/agentrl/adapter.sock'); "
                                      "s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); "
                                      "print(b''.join(iter(lambda: s.recv(4096), b'')).decode())\"")
            host = await a.exec(f"{curl} http://127.0.0.1:{host_port}/", timeout_s=20)
            other = await a.exec(f"{curl} http://127.0.0.1:8002/", timeout_s=20)
            outside = await a.exec(f"{curl} http://10.255.255.1/", timeout_s=20)
            b_own = await b.exec(f"{curl} http://127.0.0.1:8002/")
            return own, via_socket, host, other, outside, b_own
    own, via_socket, host, other, outside, b_own = run(go())
    host_http.shutdown()
    assert own.stdout == b"adapter says hi\n", own.stderr
    assert b"adapter says hi" in via_socket.stdout
    assert host.exit_code != 0 and b"Connection refused" in host.stderr
    assert other.exit_code != 0 and b"Connection refused" in other.stderr
    assert outside.exit_code != 0 and b"unreachable" in outside.stderr.lower()
    assert b_own.stdout == b"adapter says hi\n"


def test_command_lines():
    spec = SandboxSpec(workdir="/work", ro_binds={"/opt/tools": "/tools"}, adapter_socket="/run/x.sock")
    argv = bwrap_argv(spec, workdir_host="/scratch/w", etc_host="/scratch/etc", rootfs_host=None)
    assert argv[0] == "bwrap" and "--clearenv" in argv and "--die-with-parent" in argv
    # the supervisor makes the user namespace (see test_the_agent_can_write_its_home_and_tmp)
    assert {"--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"} <= set(argv)
    assert not {"--unshare-all", "--unshare-user", "--unshare-user-try"} & set(argv)
    assert ["--bind", "/scratch/w", "/work"] == argv[argv.index("/scratch/w") - 1:argv.index("/scratch/w") + 2]
    assert ["--ro-bind", "/opt/tools", "/tools"] == argv[argv.index("/opt/tools") - 1:argv.index("/opt/tools") + 2]
    assert "/run/agentrl/adapter.sock" in argv
    image = bwrap_argv(SandboxSpec(), workdir_host=None, etc_host=None, rootfs_host="/cache/rootfs/x")
    i = image.index("/cache/rootfs/x")
    assert image[i - 1:i + 2] == ["--bind", "/cache/rootfs/x", "/"]
    assert ("/tmp", "dir") in mount_points(image) and ("/run/agentrl", "dir") in mount_points(image)
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    with pytest.raises(ValueError):
        run(BwrapSandbox(SandboxSpec()).exec("true", user="nobody"))



def test_unprivileged_the_runtime_says_it_needs_root():
    with tempfile.TemporaryDirectory() as d:   # pytest's tmp_path is root's alone
        _unprivileged_start(Path(d))


def _unprivileged_start(tmp_path):
    tmp_path.chmod(0o777)
    # A copy nobody can read: the checkout may sit in a directory only root can enter.
    shutil.copytree(Path(__file__).resolve().parents[1] / "hpc", tmp_path / "code/hpc",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "a+rX", str(tmp_path / "code")], check=True)
    script = tmp_path / "try.py"
    script.write_text(f"""
import asyncio, sys
sys.path.insert(0, {str(tmp_path / "code")!r})
from hpc.sandbox.base import SandboxError, SandboxSpec
from hpc.sandbox.bwrap import BwrapSandbox
try:
    asyncio.run(BwrapSandbox(SandboxSpec(scratch_dir={str(tmp_path)!r})).start())
except SandboxError as e:
    print(e)
""")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                        str(script)], capture_output=True, text=True, timeout=60)
    assert "needs root" in r.stdout and "pool.runtime: apptainer" in r.stdout, r.stderr


@pytest.mark.parametrize("image", ["host", "rootfs"])
def test_the_agent_can_write_its_home_and_tmp(image, tmp_path):
    """CLIs keep state in HOME and /tmp; in mounts a user namespace owns, uid 1000 gets EOVERFLOW."""
    spec = SandboxSpec()
    if image == "rootfs":
        from hpc.images.hostroot import build_host_rootfs
        build_host_rootfs(tmp_path / "rootfs")
        spec = SandboxSpec(rootfs=str(tmp_path / "rootfs"))

    async def go():
        async with BwrapSandbox(spec) as sb:
            return await sb.exec("mkdir -p $HOME/.cli /tmp/cli-1000 && echo x > $HOME/.cli/state && "
                                 "echo y > /tmp/cli-1000/f && stat -c %U:%a $HOME /tmp", cwd="/")
    r = run(go())
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().split() == ["agent:755", "root:1777"]


def test_a_killed_fork_server_is_started_again(repo):
    from hpc.sandbox.bwrap import SUPERVISOR_PYTHON
    from hpc.sandbox.forkserver import fork_server

    async def one():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            return (await sb.exec("python3 app.py")).stdout
    assert run(one()) == b"hello from the sandbox\n"
    server = fork_server(SUPERVISOR_PYTHON)._proc
    server.kill()
    server.wait()
    assert run(one()) == b"hello from the sandbox\n"
    assert fork_server(SUPERVISOR_PYTHON)._proc.pid != server.pid
