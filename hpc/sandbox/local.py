"""The local runtime: no isolation at all, for development on a machine without bwrap or Apptainer.

Commands run on the host as the current user, in a copy of the work tree. What it keeps: the
source tree is never changed (a copy in a temp dir), the environment is the sandbox's only (nothing
of the host's leaks in), and timeouts stop the whole process group. What it does not: network,
file system or process isolation; user="root" and user="agent" both run as the current user (only
HOME/USER differ); commands that name sandbox paths literally (`cat /testbed/x`) see the host's
paths: use paths relative to the working directory. Never run an untrusted agent with it.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from .base import ExecResult, SandboxContext, SandboxError, SandboxSpec, as_argv, check_user, run_process, sandbox_env
from .layers import Layer, make_layer
from .scratch import make_scratch, reap_abandoned

UNSAFE_MESSAGE = (
    "the local sandbox runtime runs agent commands on this host with no isolation (file system, "
    "network, processes); it is for development only. To use it anyway, set `pool.runtime: local` "
    "and `pool.allow_unsafe_local: true` in the run config (`eval.pool.` for eval; "
    "LocalSandbox(..., allow_unsafe=True) from Python).")


class LocalSandbox(SandboxContext):
    def __init__(self, spec: SandboxSpec, *, allow_unsafe: bool = False):
        if not allow_unsafe:
            raise SandboxError(UNSAFE_MESSAGE)
        self.spec = spec
        self.root: Path | None = None        # the host directory that stands for spec.workdir
        self._layer: Layer | None = None
        self._scratch: Path | None = None

    async def start(self) -> None:
        await asyncio.to_thread(self._start)

    def _start(self) -> None:
        reap_abandoned(self.spec.scratch_dir)
        self._scratch = make_scratch("local", self.spec.scratch_dir)
        try:
            (self._scratch / "home").mkdir()
            if self.spec.workdir_source:
                # Always a copy: an overlay would need root, and this runtime must work without it.
                self._layer = make_layer(Path(self.spec.workdir_source), str(self._scratch),
                                         os.getuid(), os.getgid(), kind="copy")
                self.root = self._layer.path
            else:
                self.root = self._scratch / "workdir"
                self.root.mkdir()
        except BaseException:
            self._stop()
            raise

    def host_path(self, path: str) -> Path:
        """The host path of an absolute sandbox path under the work tree; anything else is refused."""
        if self.root is None:
            raise SandboxError("the local sandbox is not started")
        norm = posixpath.normpath(path)
        workdir = posixpath.normpath(self.spec.workdir)
        if not posixpath.isabs(path) or (norm != workdir and not norm.startswith(workdir + "/")):
            raise SandboxError(f"the local sandbox reaches only paths under {workdir}, not {path!r} "
                               "(it has no file system of its own)")
        return self.root / posixpath.relpath(norm, workdir)

    async def exec(self, command: Sequence[str] | str, *, user: str = "agent", cwd: str | None = None,
                   env: Mapping[str, str] | None = None, timeout_s: float | None = None,
                   stdin: bytes | None = None) -> ExecResult:
        check_user(user)
        if self._scratch is None:
            raise SandboxError("the local sandbox is not started")
        host_cwd = self.host_path(cwd or self.spec.workdir)
        full_env = sandbox_env(self.spec, env, user)
        full_env["HOME"] = str(self._scratch / "home")     # /home/agent and /root are not ours here
        return await run_process(as_argv(command), env=full_env, stdin=stdin, timeout_s=timeout_s,
                                 cwd=str(host_cwd))

    async def usage(self) -> None:
        return None        # the host's own processes and disk: nothing of a sandbox's to measure

    async def kill_processes(self) -> int:
        # No pid namespace: each exec's process group is stopped when it returns, and that is all
        # this development-only runtime can do.
        return 0

    async def write_file(self, path: str, data: bytes, *, user: str = "root", mode: int = 0o644) -> None:
        check_user(user)
        target = self.host_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)

    async def read_file(self, path: str, *, user: str = "root") -> bytes:
        check_user(user)
        try:
            return self.host_path(path).read_bytes()
        except (FileNotFoundError, IsADirectoryError) as e:
            raise FileNotFoundError(f"{path} in the sandbox: {e.strerror}") from None

    async def stop(self) -> None:
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        if self._layer is not None:
            self._layer.close()
            self._layer = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        self.root = None
