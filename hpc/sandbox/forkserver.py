"""The owner side of the sandbox fork server (hpc.sandbox.supervisor --serve).

One per owner process and supervisor Python: it starts once, then forks a supervisor per sandbox
(a fork of a warm interpreter: no Python start and imports per sandbox). It ends when this
process does, since its socket closes; if it was killed, the next fork starts another.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import hpc

from .base import SandboxError

# The supervisor runs on the system Python (SUPERVISOR_PYTHON), which does not see this interpreter's
# packages: point it at the directory that holds `hpc`, the checkout in an editable install and
# site-packages in an installed wheel. The supervisor imports nothing else from there: only hpc.sandbox and
# the standard library (and Debian's python3-seccomp, which that directory lacks).
_HPC_PARENT = str(Path(hpc.__file__).resolve().parents[1])


class ForkServer:
    """A fork server on `python`; `fork(sock)` makes a supervisor whose control socket is `sock`."""

    def __init__(self, python: str):
        self.python, self._lock = python, threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._owner: int | None = None

    def fork(self, sock: socket.socket) -> int:
        with self._lock:
            for attempt in (1, 2):
                # A fork of this process (multiprocessing, say) must not share the parent's server.
                proc, ctl = self._proc, self._sock
                if proc is None or ctl is None or self._owner != os.getpid() or proc.poll() is not None:
                    proc, ctl = self._spawn()
                try:
                    socket.send_fds(ctl, [b'{"op": "fork"}'], [sock.fileno()])
                    reply = ctl.recv(4096)
                except OSError:
                    reply = b""
                if reply:
                    msg = json.loads(reply)
                    if msg["op"] != "forked":
                        raise SandboxError(f"the sandbox fork server refused: {msg.get('error')}")
                    return msg["pid"]
                proc.wait()
                why = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()[-2000:]
                self._proc = None
                if attempt == 2:      # once more after a fork server that was killed; twice is a fault
                    raise SandboxError(f"the sandbox fork server ({self.python}) exited: {why or 'no reason given'}")
        raise AssertionError("unreachable")

    def _spawn(self) -> tuple[subprocess.Popen, socket.socket]:
        """A fresh fork server and our end of its control socket (self._proc, self._sock)."""
        self._owner = os.getpid()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self._proc = subprocess.Popen(
                [self.python, "-m", "hpc.sandbox.supervisor", "--serve", "--fd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env={"PYTHONPATH": _HPC_PARENT, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                cwd="/", start_new_session=True)     # cwd: -m would import an `hpc` found there first
        if self._sock is not None:
            self._sock.close()
        self._sock = ours
        return self._proc, ours


_fork_servers: dict[str, ForkServer] = {}
_fork_servers_lock = threading.Lock()


def fork_server(python: str) -> ForkServer:
    with _fork_servers_lock:
        return _fork_servers.setdefault(python, ForkServer(python))
