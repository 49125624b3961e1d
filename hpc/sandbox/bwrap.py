"""The bubblewrap runtime: a pid 1 in fresh namespaces, and every exec joined to it with nsenter.

    bwrap --unshare-all (pid, net, ipc, uts, cgroup) --die-with-parent --clearenv
          read-only image (or the host's /usr), writable work tree (hpc.sandbox.layers),
          fresh /proc, /dev, /tmp; sleep as the sandbox's init
    nsenter -t INIT -m -u -i -n -p -r -w -S UID -G GID -- COMMAND

No network but loopback; the only way out is the adapter's Unix socket, bind-mounted at
/run/agentrl/adapter.sock and fronted on 127.0.0.1:PORT by hpc.sandbox.forwarder, which
runs in the sandbox's network namespace only. When init dies the kernel kills every
process of the pid namespace: nothing outlives the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from .base import (
    AGENT_GID,
    AGENT_UID,
    SOCKET_IN_SANDBOX,
    ExecResult,
    SandboxContext,
    SandboxError,
    SandboxSpec,
    as_argv,
    check_user,
    read_file_via_exec,
    run_process,
    sandbox_env,
    write_file_via_exec,
)
from .layers import Layer, planned_overlay
from .scratch import make_scratch, reap_abandoned

_USR_MERGED = ("bin", "sbin", "lib", "lib64")


def write_minimal_etc(etc: Path) -> None:
    """A minimal /etc for the host-image sandbox: the host's own /etc (secrets included) stays out."""
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                f"agent:x:{AGENT_UID}:{AGENT_GID}:agent:/home/agent:/bin/bash\n")
    (etc / "group").write_text(f"root:x:0:\nagent:x:{AGENT_GID}:\n")
    (etc / "hosts").write_text("127.0.0.1 localhost sandbox\n")
    (etc / "hostname").write_text("sandbox\n")
    (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files\n")


def bwrap_argv(spec: SandboxSpec, *, workdir_host: str | None, etc_host: str | None,
               rootfs_host: str | None, home_host: str | None = None) -> list[str]:
    """The bwrap command line (pure: paths on the host are given)."""
    # Every namespace but the user namespace (--unshare-all would add one): mounts bwrap makes
    # inside a user namespace belong to it, and the agent's uid, unmapped there, gets EOVERFLOW
    # creating files in them (Claude Code could not make its /tmp/claude-1000).
    argv = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox"]
    if rootfs_host:
        # The image's own copy-on-write layer: writable, so that bwrap can make its mount
        # points (/proc, /run/agentrl, the workdir) and the agent can install packages.
        argv += ["--bind", rootfs_host, "/"]
    else:
        argv += ["--ro-bind", "/usr", "/usr"]
        for d in _USR_MERGED:
            if os.path.islink(f"/{d}"):
                argv += ["--symlink", os.readlink(f"/{d}"), f"/{d}"]
            elif os.path.isdir(f"/{d}"):
                argv += ["--ro-bind", f"/{d}", f"/{d}"]
        argv += ["--ro-bind", etc_host, "/etc", "--dir", "/root"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--dir", "/run/agentrl"]
    if home_host:      # the agent's HOME: its own, writable (CLIs keep settings and state there)
        argv += [*_parents("/home/agent"), "--bind", home_host, "/home/agent"]
    elif not rootfs_host:
        argv += ["--dir", "/home/agent"]
    if workdir_host:
        argv += ["--bind", workdir_host, spec.workdir]
    elif rootfs_host:
        argv += ["--dir", spec.workdir]
    for host, inside in spec.ro_binds.items():
        argv += [*_parents(inside), "--ro-bind", host, inside]
    if spec.adapter_socket:
        argv += ["--bind", spec.adapter_socket, SOCKET_IN_SANDBOX]
    return [*argv, "--info-fd", "3", "--", "sleep", "infinity"]


def _parents(inside: str) -> list[str]:
    # Parents bwrap has to make for a mount point would be 0700: the agent (uid 1000) could not pass them.
    return [arg for parent in reversed(PurePosixPath(inside).parents[:-1])
            for arg in ("--perms", "0755", "--dir", str(parent))]


def nsenter_argv(init_pid: int, user: str, cwd: str, command: list[str]) -> list[str]:
    uid, gid = (0, 0) if user == "root" else (AGENT_UID, AGENT_GID)
    # nsenter resolves a -w path on the host, before it enters: change directory inside instead.
    return ["nsenter", "-t", str(init_pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w",
            "-S", str(uid), "-G", str(gid), "--", "/bin/sh", "-c", 'cd "$0" && exec "$@"', cwd, *command]


class BwrapSandbox(SandboxContext):
    def __init__(self, spec: SandboxSpec):
        self.spec = spec
        self._init: subprocess.Popen | None = None
        self.init_pid: int | None = None
        self._layers: list[Layer] = []
        self._scratch: Path | None = None
        self._forwarder: subprocess.Popen | None = None

    async def start(self) -> None:
        await asyncio.to_thread(self._start)

    def _start(self) -> None:
        if os.geteuid() != 0:
            # Unprivileged bwrap nests a second user namespace under the one that owns the
            # sandbox's other namespaces, so nsenter (how exec gets in) cannot join them
            # (checked with bwrap 0.8: "reassociate to namespace 'ns/ipc' failed").
            raise SandboxError("the bwrap runtime needs root (it enters the sandbox with nsenter); "
                               "unprivileged, use sandbox.runtime: apptainer")
        for tool in ("bwrap", "nsenter"):
            if shutil.which(tool) is None:
                raise SandboxError(f"{tool} is not installed (Debian: apt-get install "
                                   f"{'bubblewrap' if tool == 'bwrap' else 'util-linux'})")
        spec = self.spec
        reap_abandoned(spec.scratch_dir)
        self._scratch = make_scratch("bwrap", spec.scratch_dir)
        try:
            workdir_host = rootfs_host = etc_host = None
            if spec.rootfs:
                rootfs_host = str(self._layer(spec.rootfs, None, None).path)
            if spec.workdir_source:
                workdir_host = str(self._layer(spec.workdir_source, AGENT_UID, AGENT_GID).path)
            if not spec.rootfs:
                etc_host = str(self._scratch / "etc")
                write_minimal_etc(Path(etc_host))
            home = self._scratch / "home"
            home.mkdir(mode=0o755)
            os.chown(home, AGENT_UID, AGENT_GID)
            argv = bwrap_argv(spec, workdir_host=workdir_host, etc_host=etc_host, rootfs_host=rootfs_host,
                              home_host=str(home))
            setup = [cmd for layer in self._layers for cmd in (layer.setup or [])]
            if setup:
                # Overlays mounted in a mount namespace of the sandbox's own (which bwrap's nests in):
                # they vanish with the sandbox even if its owner is SIGKILLed.
                argv = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                        " && ".join([*setup, 'exec "$@"']), "sh", *argv]
            r, w = os.pipe()
            argv[argv.index("--info-fd") + 1] = str(w)
            self._init = subprocess.Popen(argv, pass_fds=(w,), env={}, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          start_new_session=True)
            os.close(w)
            self.init_pid = self._read_info(r)
            self._wait_ready()
            if spec.adapter_socket:
                self._start_forwarder()
        except BaseException:
            self._stop()
            raise

    def _layer(self, source: str, uid: int | None, gid: int | None) -> Layer:
        layer = planned_overlay(Path(source), self.spec.scratch_dir, uid, gid)
        self._layers.append(layer)
        return layer

    def _read_info(self, fd: int, timeout_s: float = 30.0) -> int:
        """The sandbox's init pid, from bwrap's --info-fd JSON (the fd stays open: read until it parses)."""
        buf, deadline = b"", time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([fd], [], [], 0.1)
                if ready:
                    chunk = os.read(fd, 4096)
                    buf += chunk
                    try:
                        return int(json.loads(buf)["child-pid"])
                    except ValueError:
                        if chunk:
                            continue
                if self._init.poll() is not None:
                    err = self._init.stderr.read().decode(errors="replace").strip()
                    raise SandboxError(f"bwrap exited with {self._init.returncode}: {err}")
            raise SandboxError(f"bwrap gave no sandbox info in {timeout_s:.0f} s")
        finally:
            os.close(fd)

    def _wait_ready(self, timeout_s: float = 30.0) -> None:
        """bwrap reports its pid 1 before it has built the mounts; once pid 1 has forked the
        sandbox's command (sleep), the sandbox is complete and nsenter finds what it expects."""
        children = Path(f"/proc/{self.init_pid}/task/{self.init_pid}/children")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if children.read_text().strip():
                    return
            except FileNotFoundError:
                break
            if self._init.poll() is not None:
                break
            time.sleep(0.002)
        if self._init.poll() is not None:
            err = self._init.stderr.read().decode(errors="replace").strip()
            raise SandboxError(f"bwrap exited with {self._init.returncode}: {err}")
        raise SandboxError(f"the sandbox did not come up in {timeout_s:.0f} s (bwrap pid 1: {self.init_pid})")

    def _start_forwarder(self) -> None:
        # Host Python, in the sandbox's network namespace only: it sees the host's socket
        # path and listens on the sandbox's loopback; the image needs no Python of its own.
        argv = ["nsenter", "-t", str(self.init_pid), "-n", "--", sys.executable, "-m",
                "hpc.sandbox.forwarder", "--port", str(self.spec.adapter_port), "--unix", self.spec.adapter_socket]
        env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        self._forwarder = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           start_new_session=True)
        line = self._forwarder.stdout.readline()
        if b"listening" not in line:
            raise SandboxError(f"adapter forwarder did not start: {self._forwarder.stderr.read().decode()}")

    async def exec(self, command: Sequence[str] | str, *, user: str = "agent", cwd: str | None = None,
                   env: Mapping[str, str] | None = None, timeout_s: float | None = None,
                   stdin: bytes | None = None) -> ExecResult:
        check_user(user)
        if self.init_pid is None:
            raise SandboxError("exec before start()")
        argv = nsenter_argv(self.init_pid, user, cwd or self.spec.workdir, as_argv(command))
        return await run_process(argv, env=sandbox_env(self.spec.env, env, user), stdin=stdin, timeout_s=timeout_s)

    async def write_file(self, path: str, data: bytes, *, user: str = "root", mode: int = 0o644) -> None:
        await write_file_via_exec(self, path, data, user=user, mode=mode)

    async def read_file(self, path: str, *, user: str = "root") -> bytes:
        return await read_file_via_exec(self, path, user=user)

    async def stop(self) -> None:
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        for proc in (self._forwarder, self._init):
            if proc is not None and proc.poll() is None:
                # Nothing in a finished sandbox is worth a grace period; its pid 1 going takes
                # every process of the namespace with it.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._forwarder = self._init = None
        self.init_pid = None
        for layer in self._layers:
            layer.close()
        self._layers = []
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
