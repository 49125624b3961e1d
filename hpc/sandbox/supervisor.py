"""The host-side process of one bwrap sandbox: it builds it, runs every command in it, and ends it.

`python3 -m hpc.sandbox.supervisor --serve` (the system Python, where Debian's python3-seccomp
lives) is a fork server, one per owner process; it forks one supervisor per sandbox, each with a
SOCK_SEQPACKET control socket from the owner (hpc.sandbox.bwrap). A supervisor:

1. Takes a uid slot (a lock file held for the sandbox's life), makes the sandbox's cgroups
   (which its commands join, and neither bwrap nor its init).
2. Forks the sandbox: a private mount namespace where the sandbox's disk (hpc.sandbox.storage) and the overlays
   are mounted, then a user namespace mapping 0..65535 to the slot's host uids, then bwrap,
   whose namespaces that user namespace owns.
3. Serves the TCP port on the sandbox's loopback that fronts the adapter's Unix socket.
4. Runs commands: fork (into the sandbox's pid namespace), join its cgroups and namespaces,
   chroot, drop to the user's uid, shrink the capability bounding set, no_new_privs, the
   seccomp filter, exec. Commands are children of no process of the sandbox, yet bound by
   all of it.
5. Kills every process of the sandbox but its init on request (before a patch is taken), and
   reads what it has taken of its limits (hpc.sandbox.usage) on request and when it dies.
6. Ends the sandbox on "stop", or when its owner goes (the control socket closes): nothing of
   it (process, mount, cgroup, scratch directory, uid slot) outlives it.

Messages are JSON; a spawn carries the command's stdin, stdout and stderr as SCM_RIGHTS fds.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

from . import forwarder, linux
from .cgroups import PREFIX as CGROUP_PREFIX
from .cgroups import Cgroup, reap_abandoned
from .layout import STAGE_DIR, STORAGE_FILE, build_file_system, stage_binds
from .policy import MAX_SLOTS, ROOT_CAPS, SLOTS_DIR, Limits, UidRange, seccomp_filter
from .usage import Usage, cgroup_figures

CONTROL_FD = 3
SUPERVISOR_NAME = "agentrl-sandbox"      # as `ps -o comm` shows them
FORK_SERVER_NAME = "agentrl-forks"
NAMESPACES = (("user", linux.CLONE_NEWUSER), ("mnt", linux.CLONE_NEWNS), ("ipc", linux.CLONE_NEWIPC),
              ("uts", linux.CLONE_NEWUTS), ("net", linux.CLONE_NEWNET), ("cgroup", linux.CLONE_NEWCGROUP))


def take_slot(slots_dir: str) -> tuple[int, int]:
    """(slot, fd of its lock file): the first slot no live sandbox holds; the lock dies with us."""
    os.makedirs(slots_dir, mode=0o700, exist_ok=True)
    for slot in range(MAX_SLOTS):
        fd = os.open(os.path.join(slots_dir, str(slot)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return slot, fd
        except BlockingIOError:
            os.close(fd)
    raise RuntimeError(f"all {MAX_SLOTS} sandbox uid slots of this node are taken ({slots_dir})")


_FILTER = None


def sandbox_filter():
    """The seccomp filter, built once per process: the fork server builds it, its supervisors inherit it."""
    global _FILTER
    if _FILTER is None:
        _FILTER = seccomp_filter()
    return _FILTER


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return "X"


class Supervisor:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.limits = Limits(**cfg.get("limits", {}))
        self.slot, self._slot_fd = take_slot(cfg.get("slots_dir", SLOTS_DIR))
        self.uids = UidRange(self.slot)
        self.filter = sandbox_filter()
        reap_abandoned(_alive)
        self.cgroup = Cgroup.create(f"{CGROUP_PREFIX}{os.getpid()}.{self.slot}", self.limits)
        self.bwrap_pid: int | None = None
        self.init_pid: int | None = None
        self.ns_fds: list[tuple[int, int]] = []
        self.root_fd = -1
        self.pidns: int | None = None
        self.spared: set[int] = set()
        self.spawned: set[int] = set()
        self.storage: dict = {"backing": "", "why": None}

    # -- building the sandbox ---------------------------------------------------------------
    def boot(self) -> None:
        up_r, up_w = os.pipe()          # child -> us: "my user namespace exists"
        go_r, go_w = os.pipe()          # us -> child: "its uid map is written"
        err_r, err_w = os.pipe()
        info_r, info_w = os.pipe()      # bwrap's --info-fd
        argv, self._staged = stage_binds([a if a != "@INFO_FD@" else str(info_w) for a in self.cfg["bwrap"]])
        os.makedirs(STAGE_DIR, mode=0o755, exist_ok=True)
        pid = os.fork()
        if pid == 0:
            for fd in (up_r, go_w, err_r, info_r):
                os.close(fd)
            try:
                self._become_sandbox(up_w, go_r)
                os.set_inheritable(info_w, True)
                os.execvp(argv[0], argv)
            except BaseException as e:      # noqa: BLE001  (the child must never return)
                os.write(err_w, f"{type(e).__name__}: {e}".encode())
            os._exit(127)
        self.bwrap_pid = pid
        for fd in (up_w, go_r, err_w, info_w):
            os.close(fd)
        try:
            if os.read(up_r, 1) != b"u":
                raise RuntimeError(f"building the sandbox failed: {os.read(err_r, 4096).decode(errors='replace')}")
            for f in ("uid_map", "gid_map"):
                Path(f"/proc/{pid}/{f}").write_text(self.uids.id_map())
            os.write(go_w, b"g")
            self.init_pid = init_pid = self._read_info(pid, info_r, err_r)
            self._wait_ready(init_pid)
        finally:
            for fd in (up_r, go_w, err_r, info_r):
                os.close(fd)
        for name, flag in NAMESPACES:
            self.ns_fds.append((os.open(f"/proc/{self.init_pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), flag))
        self.root_fd = os.open(f"/proc/{self.init_pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.pidns = os.stat(f"/proc/{self.init_pid}/ns/pid").st_ino
        with contextlib.suppress(OSError, ValueError):
            self.storage = json.loads(Path(self.cfg["scratch"], STORAGE_FILE).read_text())

    def _become_sandbox(self, up_w: int, go_r: int) -> None:
        """In the forked child: a mount namespace with its file system, the user namespace.

        bwrap and the sandbox's init stay out of its cgroups, which only commands join: whoever
        the OOM killer picks in a cgroup dies, and were it init every process of the sandbox would
        go with it, the agent's own allocation looking like a dead node."""
        linux.unshare(linux.CLONE_NEWNS)
        build_file_system(self.cfg, self.uids, self.limits, self._staged)
        linux.unshare(linux.CLONE_NEWUSER)
        os.write(up_w, b"u")
        if os.read(go_r, 1) != b"g":
            raise RuntimeError("the supervisor did not map the user namespace")
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)

    def _read_info(self, bwrap_pid: int, info_r: int, err_r: int, timeout_s: float = 30.0) -> int:
        buf, deadline = b"", time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            chunk = os.read(info_r, 4096)
            if not chunk:
                err = os.read(err_r, 4096).decode(errors="replace")
                _, status = os.waitpid(bwrap_pid, 0)
                self.bwrap_pid = None
                raise RuntimeError(f"bwrap exited ({os.waitstatus_to_exitcode(status)}): {err}".rstrip(": "))
            buf += chunk
            with contextlib.suppress(ValueError):
                return int(json.loads(buf)["child-pid"])
        raise RuntimeError(f"bwrap gave no sandbox info in {timeout_s:.0f} s")

    def _wait_ready(self, init_pid: int, timeout_s: float = 30.0) -> None:
        """bwrap reports pid 1 before its mounts are done; once pid 1 is sleep (exec'd after the
        mounts), they are."""
        cmdline = Path(f"/proc/{init_pid}/cmdline")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if cmdline.read_bytes() == b"sleep\0infinity\0":
                    self.spared = {init_pid}
                    return
            except FileNotFoundError:
                raise RuntimeError("bwrap exited while starting the sandbox (its message is above)") from None
            time.sleep(0.002)
        raise RuntimeError(f"the sandbox did not come up in {timeout_s:.0f} s")

    # -- running commands -------------------------------------------------------------------
    def spawn(self, req: dict, fds: list[int]) -> int:
        pid = os.fork()
        if pid == 0:
            try:
                self._exec_child(req, fds)
            except BaseException as e:      # noqa: BLE001
                with contextlib.suppress(OSError):
                    os.write(2, f"agentrl sandbox: cannot run {req['argv'][0]!r}: {e}\n".encode())
            os._exit(127)
        self.spawned.add(pid)
        return pid

    def _exec_child(self, req: dict, fds: list[int]) -> None:
        os.setsid()
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        self.cgroup.join()
        for fd, flag in self.ns_fds:
            linux.setns(fd, flag)
        os.fchdir(self.root_fd)
        os.chroot(".")
        keep = ROOT_CAPS if req["user"] == "root" else frozenset()
        linux.drop_bounding_set(keep)
        uid = 0 if req["user"] == "root" else 1000
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        os.chdir(req["cwd"])
        linux.no_new_privs()
        self.filter.load()
        os.closerange(3, 65536)
        env = req["env"]
        os.execvpe(req["argv"][0], req["argv"], env)

    def kill_all(self) -> int:
        """SIGKILL every process of the sandbox's pid namespace but its init, until none is left."""
        killed = 0
        for _ in range(200):
            found = 0
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) in self.spared:
                    continue
                pid = int(name)
                try:
                    if os.stat(f"/proc/{pid}/ns/pid").st_ino != self.pidns or _state(pid) in ("Z", "X"):
                        continue
                    os.kill(pid, signal.SIGKILL)
                    found += 1
                except (FileNotFoundError, ProcessLookupError, PermissionError):
                    continue
            killed += found
            if not found:
                return killed
            time.sleep(0.005)
        raise RuntimeError("processes of the sandbox kept appearing after 200 rounds of SIGKILL")

    def usage(self) -> Usage:
        """Its cgroup's counters, and its disk and /tmp as statvfs sees them (where init still lives)."""
        figures: dict = {**cgroup_figures(self.cgroup.files()), "disk_backing": self.storage.get("backing", "")}
        for name, inside in (("disk", "/home/agent"), ("tmp", "/tmp")):
            try:
                st = os.statvfs(f"/proc/{self.init_pid}/root{inside}")
            except OSError:
                continue
            figures[f"{name}_size"], figures[f"{name}_free"] = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        return Usage(**figures)

    def reap(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return out
            if pid == 0:
                return out
            out.append((pid, os.waitstatus_to_exitcode(status)))

    def teardown(self) -> None:
        for pid in (self.init_pid, self.bwrap_pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.bwrap_pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.bwrap_pid, 0)
        if self.pidns:
            with contextlib.suppress(RuntimeError):
                self.kill_all()
        self.reap()
        self.cgroup.remove()
        scratch = self.cfg.get("scratch")
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        os.close(self._slot_fd)


def listen_in(netns_fd: int, port: int) -> socket.socket:
    """A listening socket in the sandbox's network namespace (a socket keeps the namespace it was made in)."""
    host_ns = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        linux.setns(netns_fd, linux.CLONE_NEWNET)
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen(128)
            s.setblocking(False)
            return s
        finally:
            linux.setns(host_ns, linux.CLONE_NEWNET)
    finally:
        os.close(host_ns)


async def serve(sock: socket.socket, sup: Supervisor) -> None:
    loop = asyncio.get_running_loop()
    stopped = loop.create_future()

    def send(msg: dict) -> None:
        with contextlib.suppress(OSError):
            sock.send(json.dumps(msg).encode())

    def on_child() -> None:
        for pid, code in sup.reap():
            if pid in sup.spawned:
                sup.spawned.discard(pid)
                send({"op": "exit", "pid": pid, "code": code})
            elif pid == sup.bwrap_pid:
                sup.bwrap_pid = None
                send({"op": "died", "code": code, "usage": sup.usage().to_json()})
                if not stopped.done():
                    stopped.set_result(None)

    def on_message() -> None:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        if not data:                     # the owner is gone
            if not stopped.done():
                stopped.set_result(None)
            return
        req = json.loads(data)
        try:
            if req["op"] == "spawn":
                pid = sup.spawn(req, fds)
                send({"op": "spawned", "id": req["id"], "pid": pid})
            elif req["op"] == "usage":
                send({"op": "usage", "id": req["id"], "usage": sup.usage().to_json()})
            elif req["op"] == "kill_all":
                send({"op": "killed", "id": req["id"], "count": sup.kill_all()})
            elif req["op"] == "stop" and not stopped.done():
                stopped.set_result(None)
        except Exception as e:  # noqa: BLE001  (reported to the owner, who raises SandboxError)
            send({"op": "error", "id": req.get("id"), "error": f"{type(e).__name__}: {e}"})
        finally:
            for fd in fds:
                os.close(fd)

    loop.add_signal_handler(signal.SIGCHLD, on_child)
    sock.setblocking(False)
    loop.add_reader(sock.fileno(), on_message)
    fwd = sup.cfg.get("forwarder")
    # TCP on the sandbox's loopback -> the adapter's Unix socket, for CLIs that only speak TCP.
    netns = dict((f, fd) for fd, f in sup.ns_fds)[linux.CLONE_NEWNET]
    server = await asyncio.start_server(forwarder.handler(fwd["unix"]), sock=listen_in(netns, fwd["port"])) \
        if fwd else None
    linux.setns(os.open(f"/proc/{sup.init_pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC), linux.CLONE_NEWPID)
    send({"op": "ready", "init": sup.init_pid, "uid_base": sup.uids.base, "unenforced": sup.cgroup.unenforced,
          "storage": sup.storage})
    on_child()
    await stopped
    loop.remove_reader(sock.fileno())
    if server:
        server.close()


def supervise(sock: socket.socket) -> int:
    """One sandbox, from its config (the first message) to its end."""
    cfg = json.loads(sock.recv(1 << 20))
    log = cfg.get("log")
    if log:     # this sandbox's diagnostics (and bwrap's) in a file of its own, read by the owner on failure
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
    try:
        sup = Supervisor(cfg)
    except Exception as e:  # noqa: BLE001
        sock.send(json.dumps({"op": "error", "error": f"{type(e).__name__}: {e}"}).encode())
        return 1
    try:
        sup.boot()
        asyncio.run(serve(sock, sup))
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        with contextlib.suppress(OSError):
            sock.send(json.dumps({"op": "error", "error": f"{type(e).__name__}: {e}"}).encode())
        return 1
    finally:
        sup.teardown()
    return 0


def serve_forks(server: socket.socket) -> int:
    """The fork server: one per owner process, it forks a supervisor per sandbox (a fork of a warm
    interpreter, not a Python start and its imports per sandbox). Ends when its owner does."""
    linux.set_name(FORK_SERVER_NAME)
    try:
        sandbox_filter()
    except RuntimeError:
        pass        # python3-seccomp missing: each supervisor says so to its owner
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)       # its children are the owner's business: no zombies
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(server, 4096, 1)
        except OSError:
            return 0
        if not data:
            return 0
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            server.send(json.dumps({"op": "error", "error": "a fork request carries one socket"}).encode())
            continue
        pid = os.fork()
        if pid == 0:
            server.close()
            linux.set_name(SUPERVISOR_NAME)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setsid()
            code = 1
            try:
                code = supervise(socket.socket(fileno=fds[0]))
            finally:
                os._exit(code)
        os.close(fds[0])
        server.send(json.dumps({"op": "forked", "pid": pid}).encode())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    fd = int(argv[argv.index("--fd") + 1]) if "--fd" in argv else CONTROL_FD
    os.set_inheritable(fd, False)     # no process of the sandbox may hold the control socket
    sock = socket.socket(fileno=fd)
    # The owner's death closes the socket; a SIGKILL of the owner also reaches us this way.
    return serve_forks(sock) if "--serve" in argv else supervise(sock)


if __name__ == "__main__":
    sys.exit(main())
