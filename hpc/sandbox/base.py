"""The Sandbox protocol, its values, and the exec plumbing every runtime shares."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..procs import group_alive, kill_group
from .policy import Limits
from .usage import Usage

AGENT_UID = 1000
AGENT_GID = 1000
SOCKET_IN_SANDBOX = "/run/agentrl/adapter.sock"   # where the adapter's Unix socket appears
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KILL_GRACE_S = 2.0


class SandboxError(RuntimeError):
    """The sandbox itself failed (did not boot, left processes behind): an infrastructure failure."""


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_s: float
    timed_out: bool = False


@dataclass(frozen=True)
class SandboxSpec:
    """What to run a sandbox from.

    `rootfs`: a rootfs directory (an image extracted by hpc.images), or None for the
    host's own /usr, read-only (the embedded default's bundled tasks need only Python).
    `workdir`: the task's work tree inside the sandbox; `workdir_source`: the host
    directory it starts as (copied on write: the source is never changed).
    """

    workdir: str = "/testbed"
    workdir_source: str | None = None
    rootfs: str | None = None
    # The image as a stack of layer directories instead, top first (the cache's "layers" format):
    # overlayfs stacks them, so images that share a base share its files on disk
    rootfs_layers: tuple[str, ...] = ()
    image_env: Mapping[str, str] = field(default_factory=dict)   # the image's ENV (its OCI config)
    env: Mapping[str, str] = field(default_factory=dict)
    # Host path -> sandbox path, read-only (agent CLIs, a tools directory).
    ro_binds: Mapping[str, str] = field(default_factory=dict)
    # The adapter's Unix socket on the host: bind-mounted in, and fronted by a TCP forwarder.
    adapter_socket: str | None = None
    adapter_port: int = 8000
    scratch_dir: str | None = None   # node-local disk for the writable layer (default: a temp dir)
    # What holds the writable layers and HOME, sized to limits.storage_mb (hpc.sandbox.storage):
    # "auto" (a disk image where the node can, else tmpfs), "disk" or "tmpfs".
    storage: str = "auto"
    limits: Limits = field(default_factory=Limits)
    # Directories the sandbox's root must own in an image (whose files belong to host uids the
    # sandbox does not map, so its root may not write them): made if missing, handed to that root.
    root_dirs: tuple[str, ...] = ()


class Sandbox(Protocol):
    async def start(self) -> None: ...

    async def exec(self, command: Sequence[str] | str, *, user: str = "agent", cwd: str | None = None,
                   env: Mapping[str, str] | None = None, timeout_s: float | None = None,
                   stdin: bytes | None = None) -> ExecResult: ...

    async def write_file(self, path: str, data: bytes, *, user: str = "root", mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, *, user: str = "root") -> bytes: ...

    async def kill_processes(self) -> int: ...

    async def usage(self) -> Usage | None: ...     # None: this runtime does not measure it

    async def stop(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc) -> None: ...


class SandboxContext:
    """`async with` for every runtime: start on entry, stop on exit (also after an error)."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()


def check_user(user: str) -> None:
    if user not in ("agent", "root"):
        raise ValueError(f"user must be 'agent' or 'root', got {user!r}")


def as_argv(command: Sequence[str] | str) -> list[str]:
    """A string is a bash command line; a sequence is argv as is."""
    return ["/bin/bash", "-c", command] if isinstance(command, str) else list(command)


def sandbox_env(spec: SandboxSpec, extra: Mapping[str, str] | None, user: str) -> dict[str, str]:
    """The whole environment of a command in the sandbox: nothing of the host's leaks in.

    The image's ENV (a PATH with a tool its build installed) comes over the defaults; the sandbox's
    identity (HOME, USER) over the image's, whose user it does not run as; then the sandbox's own
    variables and the command's."""
    home = "/root" if user == "root" else "/home/agent"
    env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "TERM": "dumb"}
    env.update(spec.image_env)
    env.update({"HOME": home, "USER": user})
    env.update(spec.env)
    env.update(extra or {})
    return env


async def run_process(argv: list[str], *, env: Mapping[str, str], stdin: bytes | None,
                      timeout_s: float | None, cwd: str | None = None) -> ExecResult:
    """Run `argv` in a process group of its own; on timeout stop the whole group, loudly if it survives."""
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, env=dict(env), start_new_session=True, cwd=cwd,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
    except asyncio.TimeoutError:
        gone = await asyncio.to_thread(kill_group, proc.pid, KILL_GRACE_S)
        out, err = await proc.communicate()
        if not gone or group_alive(proc.pid):
            raise SandboxError(f"processes of {argv[-1]!r} survived SIGKILL after a timeout "
                               f"(process group {proc.pid})") from None
        return ExecResult(proc.returncode if proc.returncode is not None else -9, out, err,
                          time.monotonic() - t0, timed_out=True)
    except asyncio.CancelledError:
        kill_group(proc.pid, 0)
        raise
    # The command may have left children in its group (a background job): they go with it.
    if group_alive(proc.pid):
        kill_group(proc.pid, KILL_GRACE_S)
    assert proc.returncode is not None     # communicate() returned: it has exited
    return ExecResult(proc.returncode, out, err, time.monotonic() - t0)


async def write_file_via_exec(sandbox: Sandbox, path: str, data: bytes, *, user: str, mode: int) -> None:
    """write_file for runtimes that reach files only through exec: the data travels on stdin, never
    in argv (no ARG_MAX, no quoting)."""
    r = await sandbox.exec(["/bin/sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"',
                            "sh", path, oct(mode)[2:]], user=user, cwd="/", stdin=data)
    if r.exit_code != 0:
        raise SandboxError(f"writing {path} failed: {r.stderr.decode(errors='replace').strip()}")


async def read_file_via_exec(sandbox: Sandbox, path: str, *, user: str) -> bytes:
    r = await sandbox.exec(["cat", "--", path], user=user, cwd="/")
    if r.exit_code != 0:
        raise FileNotFoundError(f"{path} in the sandbox: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout

