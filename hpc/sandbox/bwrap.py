"""The bubblewrap runtime: a sandbox per supervisor process, every command run by it.

    supervisor (host root, one per sandbox; hpc.sandbox.supervisor)
      mount namespace: its disk (an ext4 image sized to storage_mb), overlays of the image and the work tree
        user namespace: uids 0..65535 -> an unprivileged host range of the sandbox's own
          bwrap --unshare-{pid,net,ipc,uts,cgroup} --cap-drop ALL ... -- sleep infinity   (init)
      commands: fork, join the namespaces and cgroups, drop to agent (1000) or the namespace's
        root with a short bounding set, no_new_privs, seccomp, exec
      TCP 127.0.0.1:PORT in the sandbox -> the adapter's Unix socket

No network but loopback; the only way out is the adapter's socket, bind-mounted at
/run/agentrl/adapter.sock and fronted on 127.0.0.1:PORT by the supervisor. When init dies the
kernel kills every process of the pid namespace; when the owner dies the supervisor ends the
sandbox: nothing outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import select
import shutil
import signal
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import (
    AGENT_UID,
    KILL_GRACE_S,
    ExecResult,
    SandboxContext,
    SandboxError,
    SandboxSpec,
    as_argv,
    check_user,
    read_file_via_exec,
    sandbox_env,
    write_file_via_exec,
)
from .bwrap_args import bwrap_argv, mount_points, write_minimal_etc
from .forkserver import fork_server
from .scratch import make_scratch, reap_abandoned
from .storage import check_mode
from .usage import Usage, dead

SUPERVISOR_PYTHON = "/usr/bin/python3"   # Debian's, where python3-seccomp installs libseccomp's binding
_DRAIN_S = 2.0        # after a command exits, how long its output may still trickle in
_ids = itertools.count(1)


class BwrapSandbox(SandboxContext):
    def __init__(self, spec: SandboxSpec, *, python: str = SUPERVISOR_PYTHON):
        self.spec = spec
        self.python = python
        self.init_pid: int | None = None
        self.uid_base: int | None = None
        self.unenforced: dict[str, str] = {}
        # what holds its writable layers and HOME ("disk", "tmpfs", "dir"), and why it is not a disk image
        self.storage: dict[str, str | None] = {}
        self._final_usage: Usage | None = None      # read as it died
        self.supervisor_pid: int | None = None
        self._pidfd: int | None = None
        self._sock: socket.socket | None = None
        self._scratch: Path | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._exits: dict[int, asyncio.Future] = {}
        self._dead: str | None = None

    async def start(self) -> None:
        sock = await asyncio.to_thread(self._start)
        self._loop = loop = asyncio.get_running_loop()
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._on_message)

    def _start(self) -> socket.socket:
        """Start the supervisor; its control socket (self._sock)."""
        if os.geteuid() != 0:
            # The supervisor maps a range of host uids for the sandbox's user namespace and
            # mounts its layers: both need root. Unprivileged sites use Apptainer.
            raise SandboxError("the bwrap runtime needs root (it maps the sandbox's uid range and mounts "
                               "its layers); unprivileged, set pool.runtime: apptainer in the run config")
        for tool, pkg in (("bwrap", "bubblewrap"), (self.python, "python3 and python3-seccomp")):
            if shutil.which(tool) is None:
                raise SandboxError(f"{tool} is not installed (Debian: apt-get install {pkg})")
        reap_abandoned(self.spec.scratch_dir)
        self._scratch = make_scratch("bwrap", self.spec.scratch_dir)
        try:
            return self._launch(self._plan(self._scratch))
        except BaseException:
            self._stop()
            raise

    def _plan(self, scratch: Path) -> dict[str, Any]:
        """The supervisor's config: the layers to mount, the image's root to prepare, bwrap's argv."""
        spec = self.spec
        layers: list[dict[str, Any]] = []
        rootfs_host: str | None = None
        workdir_host: str | None = None
        etc_host: str | None = None
        lowers = list(spec.rootfs_layers) or ([spec.rootfs] if spec.rootfs else [])
        for lower in lowers:
            if not os.path.isdir(lower):
                raise SandboxError(f"the image {lower} is not a directory")
            if ":" in lower or "," in lower:     # overlayfs's lowerdir= separators
                raise SandboxError(f"the image {lower} has ':' or ',' in its path, which an overlay mount "
                                   "cannot name: move the image cache to a path without them")
        if lowers:
            rootfs_host = str(scratch / "root")
            layers.append({"source": ":".join(lowers), "merged": rootfs_host, "owner": None})
        if spec.workdir_source:
            if not os.path.isdir(spec.workdir_source):
                raise SandboxError(f"the work tree {spec.workdir_source} is not a directory")
            workdir_host = str(scratch / "work")
            layers.append({"source": spec.workdir_source, "merged": workdir_host, "owner": AGENT_UID})
        if not lowers:
            etc_host = str(scratch / "etc")
            write_minimal_etc(Path(etc_host))
        for layer in layers:
            os.mkdir(layer["merged"])
        disk = scratch / "disk"
        argv = bwrap_argv(spec, workdir_host=workdir_host, etc_host=etc_host, rootfs_host=rootfs_host,
                          home_host=str(disk / "home"))
        return {"bwrap": argv, "disk": str(disk), "layers": layers, "scratch": str(scratch),
                "image_root": self._image_root(rootfs_host, argv, agent_tree=not spec.workdir_source),
                "limits": {k: getattr(spec.limits, k) for k in ("cpus", "memory_mb", "storage_mb", "pids")},
                "storage": check_mode(spec.storage),
                "forwarder": {"port": spec.adapter_port, "unix": spec.adapter_socket} if spec.adapter_socket else None}

    def _image_root(self, root: str | None, argv: list[str], *, agent_tree: bool) -> dict | None:
        """An image's files belong to host uids the sandbox does not map: the supervisor hands the
        sandbox's root its mount points and `root_dirs`, and the agent its work tree if the image holds it."""
        if root is None:
            return None
        points = [("/", "dir"), *mount_points(argv), *((d, "dir") for d in self.spec.root_dirs)]
        return {"path": root, "mountpoints": points, "agent_tree": self.spec.workdir if agent_tree else None}

    def _launch(self, cfg: dict[str, Any]) -> socket.socket:
        cfg["log"] = str(Path(cfg["scratch"]) / "supervisor.log")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        with theirs:
            self.supervisor_pid = fork_server(self.python).fork(theirs)
        with contextlib.suppress(ProcessLookupError):     # gone already: its socket says why below
            self._pidfd = os.pidfd_open(self.supervisor_pid)
        ours.send(json.dumps(cfg).encode())
        ours.settimeout(60)
        try:
            reply = ours.recv(1 << 20)
        except TimeoutError:
            raise SandboxError("the sandbox supervisor did not answer in 60 s") from None
        except OSError:
            reply = b""
        finally:
            ours.settimeout(None)
        msg: dict[str, Any] = json.loads(reply) if reply else {"op": "error", "error": "it exited"}
        if msg["op"] != "ready":
            raise SandboxError(f"the sandbox did not start: {msg.get('error')}\n{self._supervisor_stderr()}")
        self.init_pid, self.uid_base, self.unenforced = msg["init"], msg["uid_base"], msg["unenforced"]
        self.storage = msg.get("storage") or {}
        return ours

    def _supervisor_stderr(self) -> str:
        if self._scratch is None:
            return ""
        try:
            return (self._scratch / "supervisor.log").read_text(errors="replace").strip()[-2000:]
        except OSError:
            return ""

    # -- the control channel ------------------------------------------------------------------
    def _on_message(self) -> None:
        if self._sock is None or self._loop is None:     # stopped: the reader is being removed
            return
        try:
            data = self._sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._fail_all("the sandbox supervisor exited: " + (self._supervisor_stderr() or "no reason given"))
            return
        msg = json.loads(data)
        op = msg["op"]
        if op == "spawned":
            self._exits[msg["pid"]] = self._loop.create_future()
            self._resolve(msg["id"], msg["pid"])
        elif op == "exit":
            fut = self._exits.get(msg["pid"])
            if fut is not None and not fut.done():
                fut.set_result(msg["code"])
        elif op == "killed":
            self._resolve(msg["id"], msg["count"])
        elif op == "usage":
            self._resolve(msg["id"], Usage.from_json(msg["usage"]))
        elif op == "error":
            fut = self._pending.pop(msg.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_exception(SandboxError(msg["error"]))
        elif op == "died":
            self._final_usage = Usage.from_json(msg["usage"]) if msg.get("usage") else None
            self._fail_all(f"the sandbox's init exited ({msg['code']})")

    def _resolve(self, rid: int, value) -> None:
        fut = self._pending.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result(value)

    def _fail_all(self, why: str) -> None:
        self._dead = why
        if self._loop is not None and self._sock is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._sock.fileno())
        for fut in [*self._pending.values(), *self._exits.values()]:
            if not fut.done():
                fut.set_exception(SandboxError(why))
                fut.add_done_callback(lambda f: f.exception())   # awaited or not, it is reported
        self._pending.clear()

    async def _request(self, msg: dict[str, Any], fds: Sequence[int] = ()) -> Any:
        """The supervisor's reply to `msg` (a JSON value: a pid, a count)."""
        if self._sock is None or self._loop is None:
            raise SandboxError("the sandbox is not running (exec before start(), or after stop())")
        if self._dead:
            raise SandboxError(self._dead)
        rid = msg["id"] = next(_ids)
        fut = self._pending[rid] = self._loop.create_future()
        try:
            socket.send_fds(self._sock, [json.dumps(msg).encode()], list(fds))
        except OSError:
            self._fail_all("the sandbox supervisor exited: " + (self._supervisor_stderr() or "no reason given"))
        return await fut

    # -- the Sandbox protocol ---------------------------------------------------------------
    async def exec(self, command: Sequence[str] | str, *, user: str = "agent", cwd: str | None = None,
                   env: Mapping[str, str] | None = None, timeout_s: float | None = None,
                   stdin: bytes | None = None) -> ExecResult:
        check_user(user)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        in_r, in_w = os.pipe() if stdin is not None else (os.open(os.devnull, os.O_RDONLY), -1)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pid = await self._request({"op": "spawn", "argv": as_argv(command), "user": user,
                                       "cwd": cwd or self.spec.workdir,
                                       "env": sandbox_env(self.spec, env, user)}, [in_r, out_w, err_w])
        except BaseException:
            for fd in (in_w, out_r, err_r):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        out, err = _Collector(loop, out_r), _Collector(loop, err_r)
        feeder = asyncio.ensure_future(asyncio.to_thread(_feed, in_w, stdin)) if stdin is not None else None
        readers = asyncio.gather(out.run(), err.run())
        timed_out = False
        try:
            code = await asyncio.wait_for(asyncio.shield(self._exits[pid]), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
            code = await self._stop_group(pid)
        except asyncio.CancelledError:
            _killpg(pid, signal.SIGKILL)
            readers.cancel()
            out.close()
            err.close()
            raise
        finally:
            self._exits.pop(pid, None)      # a late exit message for it is then ignored
        # Children it left in its group (a background job) go with it.
        _killpg(pid, signal.SIGKILL)
        # A daemon may hold the pipes open: whatever it has not written by now is not waited for.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(readers), _DRAIN_S)
        out.close()
        err.close()
        if feeder is not None:
            with contextlib.suppress(Exception):
                await feeder
        return ExecResult(code, out.data(), err.data(), loop.time() - t0, timed_out=timed_out)

    async def _stop_group(self, pid: int) -> int:
        """SIGTERM the command's group, SIGKILL after the grace; its exit code, or SandboxError."""
        _killpg(pid, signal.SIGTERM)
        fut = self._exits[pid]
        try:
            return await asyncio.wait_for(asyncio.shield(fut), KILL_GRACE_S)
        except asyncio.TimeoutError:
            _killpg(pid, signal.SIGKILL)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), KILL_GRACE_S)
        except asyncio.TimeoutError:
            raise SandboxError(f"process {pid} survived SIGKILL after a timeout") from None

    async def kill_processes(self) -> int:
        """Kill every process of the sandbox but its init (a daemon the agent left, say)."""
        return await self._request({"op": "kill_all"})

    async def usage(self) -> Usage | None:
        """What it has taken of its limits (hpc.sandbox.usage); of a sandbox that died, as it died."""
        if not self._dead:
            try:
                return await self._request({"op": "usage"})
            except SandboxError:
                pass
        return dead(self._final_usage)

    async def write_file(self, path: str, data: bytes, *, user: str = "root", mode: int = 0o644) -> None:
        await write_file_via_exec(self, path, data, user=user, mode=mode)

    async def read_file(self, path: str, *, user: str = "root") -> bytes:
        return await read_file_via_exec(self, path, user=user)

    async def stop(self) -> None:
        self._fail_all("the sandbox was stopped")      # also stops reading its control socket
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.setblocking(True)
                self._sock.send(json.dumps({"op": "stop"}).encode())
            self._sock.close()      # the supervisor also stops on EOF
            self._sock = None
        if self._pidfd is not None:
            if not select.select([self._pidfd], [], [], 30)[0]:
                # Its bwrap dies with it (--die-with-parent); the scratch is removed below.
                if self.supervisor_pid is not None:     # it has a pidfd: it was started
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.supervisor_pid, signal.SIGKILL)
                select.select([self._pidfd], [], [], 10)
            os.close(self._pidfd)
            self._pidfd = None
        self.init_pid = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


class _Collector:
    """Everything a pipe delivers, read on the event loop; close() stops at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int):
        self.loop, self.fd = loop, fd
        self.chunks: list[bytes] = []
        self.transport: asyncio.ReadTransport | None = None

    async def run(self) -> None:
        reader = asyncio.StreamReader(limit=1 << 20)
        self.transport, _ = await self.loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(self.fd, "rb", 0))
        while chunk := await reader.read(1 << 16):
            self.chunks.append(chunk)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        else:
            with contextlib.suppress(OSError):
                os.close(self.fd)

    def data(self) -> bytes:
        return b"".join(self.chunks)


def _feed(fd: int, data: bytes) -> None:
    try:
        with open(fd, "wb", 0) as f:
            f.write(data)
    except BrokenPipeError:
        pass


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
