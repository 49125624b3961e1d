"""The Apptainer runtime (clusters): one named instance per sandbox, every exec joined to it.

    apptainer overlay create --size MIB --sparse [--fakeroot] SCRATCH/overlay.img
    apptainer instance start --containall --cleanenv --net --network none [--fakeroot]
        --overlay SCRATCH/overlay.img --workdir SCRATCH/work --home SCRATCH/home:HOME
        --bind TREE:/testbed --bind SRC:DST:ro ... --bind ADAPTER.sock:/run/agentrl/adapter.sock IMAGE NAME
    apptainer exec --cleanenv --env-file FILE --pwd CWD instance://NAME COMMAND...
    apptainer instance stop --timeout S NAME      (then --force if it is still listed)

Facts from Apptainer's documentation this relies on (sources in tests/test_sandbox_runtimes.py):
- --containall contains file systems, PID, IPC and environment: a private PID namespace, so every
  process of the sandbox dies with the instance; $HOME is a dummy mount, and with --workdir /tmp,
  /var/tmp and $HOME live in that host directory (node-local scratch) instead of the session tmpfs.
- --net --network none: a network namespace with loopback only; `none` is the one network an
  unprivileged user may ask for by default.
- --writable-tmpfs is capped by `sessiondir max size` (64 MiB by default): far too small for a pip
  install. The writable layer is instead an ext3 overlay image from `overlay create --sparse`
  (disk used only as written), which works unprivileged in setuid and user-namespace
  installations alike; a bare directory overlay needs root in a setuid installation.
- exec into an instance joins its namespaces; --cleanenv keeps the host environment out and
  --env-file supplies the whole environment (values shell-quoted: the file is shell-evaluated),
  except HOME, which only --home may set.

Users: Apptainer cannot switch users inside an instance. Every command of one sandbox runs as the
invoking user, or, with fakeroot=True, as the "fake root" of a user namespace (uid 0 inside, the
invoking user outside). So user="agent" and user="root" run with the same identity here; only
HOME/USER differ. Ask for fakeroot only where grading needs root (apt, chown): the agent then
has (fake) root in the container too.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..procs import kill_group
from .base import (
    DEFAULT_PATH,
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
from .layers import Layer, make_layer
from .policy import dropped_capabilities, oci_seccomp_profile
from .scratch import make_scratch, reap_abandoned
from .usage import Usage

FORWARDER_IN_SANDBOX = "/run/agentrl/forwarder.py"
FORWARDER_HOST = str(Path(__file__).with_name("forwarder.py"))
OVERLAY_MIB = 16384        # sparse: the size is a cap, not an allocation
START_TIMEOUT_S = 300.0    # a SIF on a parallel filesystem can take a while to mount
STOP_GRACE_S = 10
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class InstancePaths:
    """Host paths of one sandbox's instance (all under its scratch directory, except `worktree`'s source)."""

    overlay: str           # ext3 overlay image: the writable layer over the image
    workdir: str           # apptainer --workdir: /tmp, /var/tmp
    home: str              # bound at the container's $HOME
    worktree: str | None   # copy-on-write layer of spec.workdir_source, bound at spec.workdir


def home_inside(fakeroot: bool) -> str:
    return "/root" if fakeroot else "/home/agent"


def _bind(src: str, dst: str, *, ro: bool = False) -> list[str]:
    # --bind takes src:dst[:opts] and splits lists on commas: such paths cannot be said this way.
    for p in (src, dst):
        if ":" in p or "," in p:
            raise ValueError(f"bind path {p!r} contains ':' or ',', which apptainer --bind cannot express")
    return ["--bind", f"{src}:{dst}:ro" if ro else f"{src}:{dst}"]


def overlay_create_argv(apptainer: str, image_path: str, size_mib: int, *, fakeroot: bool) -> list[str]:
    # --fakeroot makes the overlay's layout usable by a --fakeroot instance.
    return [apptainer, "overlay", "create", "--size", str(size_mib), "--sparse",
            *(["--fakeroot"] if fakeroot else []), image_path]


def security_argv(fakeroot: bool, seccomp_profile: str | None) -> list[str]:
    """The sandbox policy (hpc.sandbox.policy) in Apptainer's options: a fake root keeps only the
    capabilities grading needs (--drop-caps the rest); without fakeroot, --no-privs; the seccomp
    filter as an OCI profile (--security seccomp:FILE, where the installation supports it)."""
    argv = ["--drop-caps", ",".join(dropped_capabilities())] if fakeroot else ["--no-privs"]
    if seccomp_profile:
        argv += ["--security", f"seccomp:{seccomp_profile}"]
    return argv


def instance_start_argv(apptainer: str, spec: SandboxSpec, image: str, name: str, paths: InstancePaths, *,
                        fakeroot: bool, seccomp_profile: str | None = None) -> list[str]:
    argv = [apptainer, "instance", "start", "--containall", "--cleanenv", "--net", "--network", "none"]
    if fakeroot:
        argv.append("--fakeroot")
    argv += security_argv(fakeroot, seccomp_profile)
    argv += ["--overlay", paths.overlay, "--workdir", paths.workdir, "--home", f"{paths.home}:{home_inside(fakeroot)}"]
    if paths.worktree:
        argv += _bind(paths.worktree, spec.workdir)
    for host, inside in spec.ro_binds.items():
        argv += _bind(host, inside, ro=True)
    if spec.adapter_socket:
        argv += _bind(spec.adapter_socket, SOCKET_IN_SANDBOX)
        argv += _bind(FORWARDER_HOST, FORWARDER_IN_SANDBOX, ro=True)
    return [*argv, image, name]


def exec_argv(apptainer: str, name: str, cwd: str, env_file: str, command: Sequence[str], *,
              security: Sequence[str] = ()) -> list[str]:
    return [apptainer, "exec", "--cleanenv", *security, "--env-file", env_file, "--pwd", cwd,
            f"instance://{name}", *command]


def stop_argv(apptainer: str, name: str, *, grace_s: int = STOP_GRACE_S, force: bool = False) -> list[str]:
    # Plain stop sends SIGINT and SIGKILLs after --timeout seconds; --force sends SIGKILL at once.
    return [apptainer, "instance", "stop", *(["--force"] if force else ["--timeout", str(grace_s)]), name]


def list_argv(apptainer: str, name: str) -> list[str]:
    return [apptainer, "instance", "list", "--json", name]


def env_file_text(env: Mapping[str, str]) -> str:
    """An --env-file: NAME=VALUE lines, shell-quoted because Apptainer evaluates the file as shell."""
    for key in env:
        if not _ENV_NAME.match(key):
            raise ValueError(f"environment variable name {key!r} is not a valid shell name")
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items())


def tool_env() -> dict[str, str]:
    """The environment of the apptainer command itself: nothing of ours, so no APPTAINERENV_* or
    APPTAINER_BIND from the host slips in. HOME comes from passwd: instances are recorded under it."""
    return {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "HOME": pwd.getpwuid(os.getuid()).pw_dir}


class ApptainerSandbox(SandboxContext):
    def __init__(self, spec: SandboxSpec, image: str, *, fakeroot: bool = False, apptainer: str = "apptainer",
                 overlay_mib: int | None = None):
        if not image:
            raise ValueError("the apptainer runtime needs an image: a SIF file or a sandbox directory")
        if not os.path.exists(image):
            raise ValueError(f"apptainer image {image} does not exist (build it with hpc.images first)")
        self.spec, self.image, self.fakeroot = spec, image, fakeroot
        # The overlay image is the sandbox's disk: writing past the task's storage_mb there is ENOSPC
        self.apptainer = apptainer
        self.overlay_mib = overlay_mib or spec.limits.storage_mb or OVERLAY_MIB
        self.name = f"agentrl-{uuid.uuid4().hex[:12]}"     # instance names are per user: make them unique
        self.instance_pid: int | None = None
        self._exe: str | None = None
        self._scratch: Path | None = None
        self._layers: list[Layer] = []
        self._forwarder: subprocess.Popen | None = None
        self._start_tried = False
        self._security: list[str] = []

    async def _tool(self, argv: list[str], what: str, timeout_s: float = 60.0) -> ExecResult:
        r = await run_process(argv, env=tool_env(), stdin=None, timeout_s=timeout_s)
        if r.timed_out or r.exit_code != 0:
            why = "timed out" if r.timed_out else f"exited with {r.exit_code}"
            raise SandboxError(f"apptainer {what} {why}: {r.stderr.decode(errors='replace').strip()}")
        return r

    def _started(self) -> tuple[str, Path]:
        """What start() set up first: the apptainer executable and the scratch directory."""
        if self._exe is None or self._scratch is None:
            raise SandboxError("the apptainer sandbox is not started")
        return self._exe, self._scratch

    async def _listed_pid(self) -> int | None:
        exe, _ = self._started()
        r = await self._tool(list_argv(exe, self.name), "instance list")
        for inst in json.loads(r.stdout or b"{}").get("instances") or []:
            if inst.get("instance") == self.name:
                return int(inst["pid"])
        return None

    async def start(self) -> None:
        self._exe = exe = shutil.which(self.apptainer)
        if exe is None:
            raise SandboxError(f"{self.apptainer} is not installed or not on PATH (module load apptainer?)")
        spec = self.spec
        try:
            reap_abandoned(spec.scratch_dir)
            self._scratch = scratch = make_scratch("apptainer", spec.scratch_dir)
            for d in ("work", "home", "env"):
                (scratch / d).mkdir(mode=0o700)
            worktree = None
            if spec.workdir_source:
                # The instance's user owns the tree: the invoking user (also fake root's outside uid).
                layer = await asyncio.to_thread(make_layer, Path(spec.workdir_source), spec.scratch_dir,
                                                os.getuid(), os.getgid())
                self._layers.append(layer)
                worktree = str(layer.path)
            paths = InstancePaths(str(scratch / "overlay.img"), str(scratch / "work"),
                                  str(scratch / "home"), worktree)
            await self._tool(overlay_create_argv(exe, paths.overlay, self.overlay_mib, fakeroot=self.fakeroot),
                             "overlay create")
            self._start_tried = True
            profile = scratch / "seccomp.json"
            profile.write_text(json.dumps(oci_seccomp_profile()))
            self._security = security_argv(self.fakeroot, str(profile))
            await self._tool(instance_start_argv(exe, spec, self.image, self.name, paths,
                                                 fakeroot=self.fakeroot, seccomp_profile=str(profile)),
                             "instance start", START_TIMEOUT_S)
            self.instance_pid = await self._listed_pid()
            if self.instance_pid is None:
                raise SandboxError(f"apptainer instance start succeeded but {self.name} is not listed")
            if spec.adapter_socket:
                await self._start_forwarder()
        except BaseException:
            await self.stop()
            raise

    async def _start_forwarder(self, timeout_s: float = 60.0) -> None:
        """TCP 127.0.0.1:PORT in the sandbox -> the adapter's Unix socket.

        Run inside the instance (`apptainer exec instance://`), not with `nsenter -t PID -n` as bwrap
        does: in a setuid installation the instance's network namespace belongs to root's user
        namespace, so an unprivileged nsenter may not join it; exec joins it in every installation
        mode. It needs python3 in the image (the forwarder is one stdlib-only file, bound read-only)
        and runs with the agent's identity, so the agent could stop it (only losing its own TCP path).
        """
        exe, scratch = self._started()
        env_file = scratch / "env" / "forwarder"
        env_file.write_text(env_file_text({"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}))
        argv = exec_argv(exe, self.name, "/", str(env_file),
                         ["python3", FORWARDER_IN_SANDBOX, "--port", str(self.spec.adapter_port),
                          "--unix", SOCKET_IN_SANDBOX], security=self._security)
        log = open(scratch / "forwarder.log", "wb")
        with log:
            self._forwarder = forwarder = subprocess.Popen(argv, env=tool_env(), stdin=subprocess.DEVNULL,
                                                           stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        assert forwarder.stdout is not None     # stdout=PIPE
        try:
            line = await asyncio.wait_for(asyncio.to_thread(forwarder.stdout.readline), timeout_s)
        except asyncio.TimeoutError:
            line = b""
        if b"listening" not in line:
            kill_group(forwarder.pid, 1.0)       # also ends a readline still waiting
            err = "\n".join((scratch / "forwarder.log").read_text(errors="replace").strip().splitlines()[-3:])
            raise SandboxError(f"adapter forwarder did not start in the instance: {err}")

    async def exec(self, command: Sequence[str] | str, *, user: str = "agent", cwd: str | None = None,
                   env: Mapping[str, str] | None = None, timeout_s: float | None = None,
                   stdin: bytes | None = None) -> ExecResult:
        check_user(user)
        if self.instance_pid is None:
            raise SandboxError("exec before start()")
        full_env = sandbox_env(self.spec, env, user)
        # HOME is the instance's --home: Apptainer refuses to override it from the environment and
        # warns on stderr ("Overriding HOME environment variable ... is not permitted", apptainer#388).
        del full_env["HOME"]
        # A private file per exec (mkstemp: mode 0600): values stay out of argv, which `ps` shows to all.
        exe, scratch = self._started()
        fd, env_path = tempfile.mkstemp(prefix="exec-", dir=scratch / "env")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(env_file_text(full_env))
            argv = exec_argv(exe, self.name, cwd or self.spec.workdir, env_path, as_argv(command),
                             security=self._security)
            return await run_process(argv, env=tool_env(), stdin=stdin, timeout_s=timeout_s)
        finally:
            os.unlink(env_path)

    async def usage(self) -> Usage | None:
        """Its overlay (the image's writable layer) and /tmp as statvfs sees them from inside; its
        memory and pids are the node's (Slurm's cgroup of the job step), not measured here."""
        try:
            r = await self.exec(["stat", "-f", "-c", "%b %a %S", "/", "/tmp"], user="root", cwd="/", timeout_s=30)
            (disk_blocks, disk_free, disk_bs), (tmp_blocks, tmp_free, tmp_bs) = (
                map(int, line.split()) for line in r.stdout.decode().splitlines()[:2])
        except (SandboxError, ValueError):
            return None
        return Usage(disk_backing="disk", disk_size=disk_blocks * disk_bs, disk_free=disk_free * disk_bs,
                     tmp_size=tmp_blocks * tmp_bs, tmp_free=tmp_free * tmp_bs)

    async def kill_processes(self) -> int:
        """Every process of the instance but its init: `kill -9 -1` from inside, in its pid namespace."""
        await self.exec(["kill", "-9", "-1"], user="root", cwd="/")
        return 0

    async def write_file(self, path: str, data: bytes, *, user: str = "root", mode: int = 0o644) -> None:
        await write_file_via_exec(self, path, data, user=user, mode=mode)

    async def read_file(self, path: str, *, user: str = "root") -> bytes:
        return await read_file_via_exec(self, path, user=user)

    async def stop(self) -> None:
        """Stop the instance (SIGINT, SIGKILL after a grace, then --force), check that it is gone,
        and remove every host trace. Safe to call twice, and after a failed start."""
        try:
            if self._forwarder is not None:
                if self._forwarder.poll() is None:
                    await asyncio.to_thread(kill_group, self._forwarder.pid, 1.0)
                self._forwarder.wait()
                if self._forwarder.stdout is not None:
                    self._forwarder.stdout.close()
                self._forwarder = None
            if self._start_tried:
                exe, _ = self._started()
                for force in (False, True):
                    await run_process(stop_argv(exe, self.name, force=force), env=tool_env(), stdin=None,
                                      timeout_s=STOP_GRACE_S + 30)
                    if await self._listed_pid() is None:
                        break
                else:
                    raise SandboxError(f"apptainer instance {self.name} survived `instance stop --force`")
                self._start_tried = False
        finally:
            self.instance_pid = None
            for layer in self._layers:
                layer.close()
            self._layers = []
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
                self._scratch = None
