"""A real network filesystem on one machine: a GlusterFS volume mounted several times through FUSE.

Each mount is a client of its own, with its own attribute, entry and negative caches, as each node
of a cluster is: what one mount writes another sees only through the volume's server, as a node
sees another's writes on NFS or Lustre. For the tests of the file contracts across nodes, and

    python -m hpc.localcluster.glusterfs up DIR [--clients 3] [--cache-s S]    (make gluster-up)
    python -m hpc.localcluster.glusterfs down DIR                              (make gluster-down)

DIR holds the volume's brick (DIR/brick), the mounts (DIR/client-0, ...) and DIR/volume.json (the
volume's name, the mounts, and the pids of what `up` started). `down` unmounts what `up` mounted,
stops and deletes the volume, and stops glusterd by its pid if `up` started it: nothing outlives it.
Needs root and Debian's glusterfs-server and glusterfs-client (tools/sysdeps.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..fsio import write_atomic
from ..procs import pid_alive

STATE = "volume.json"
_GLUSTERD_PID = "/var/run/glusterd.pid"


class GlusterError(RuntimeError):
    pass


@dataclass
class Volume:
    name: str
    root: str
    clients: list[str]
    cache_s: float | None = None             # the mounts' attribute, entry and negative timeouts
    glusterd_pid: int | None = None          # glusterd, if `up` started it
    client_pids: list[int] = field(default_factory=list)

    def save(self) -> None:
        write_atomic(Path(self.root) / STATE, json.dumps(asdict(self), indent=1).encode())

    @classmethod
    def load(cls, root: Path | str) -> Volume:
        return cls(**json.loads((Path(root) / STATE).read_text()))


def missing() -> str | None:
    """Why GlusterFS cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "GlusterFS's server and FUSE mounts need root"
    for tool, pkg in (("glusterd", "glusterfs-server"), ("gluster", "glusterfs-server"),
                      ("glusterfs", "glusterfs-client")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: apt-get install {pkg}; make sysdeps)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (modprobe fuse)"
    try:
        socket.gethostbyname(socket.gethostname())    # the brick's host, as gluster names it
    except OSError:
        return f"this machine's hostname {socket.gethostname()!r} does not resolve: add it to /etc/hosts"
    return None


def _cli(*args: str, timeout_s: float = 60) -> str:
    r = subprocess.run(["gluster", "--mode=script", *args], capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise GlusterError(f"gluster {' '.join(args)} failed: {(r.stderr or r.stdout).strip()}")
    return r.stdout


def _glusterd_up() -> bool:
    return subprocess.run(["gluster", "--mode=script", "pool", "list"], capture_output=True,
                          timeout=30).returncode == 0


def _start_glusterd() -> int | None:
    """Start glusterd unless one answers; its pid if this started it."""
    if _glusterd_up():
        return None
    subprocess.run(["glusterd", "-p", _GLUSTERD_PID], check=True, timeout=60)
    deadline = time.monotonic() + 30
    while not _glusterd_up():
        if time.monotonic() > deadline:
            raise GlusterError("glusterd did not answer in 30 s: see /var/log/glusterfs/glusterd.log")
        time.sleep(0.2)
    return int(Path(_GLUSTERD_PID).read_text())


def mount_argv(volume: str, target: str, cache_s: float | None) -> list[str]:
    argv = ["glusterfs", f"--volfile-server={socket.gethostname()}", f"--volfile-id={volume}"]
    if cache_s is not None:
        argv += [f"--attribute-timeout={cache_s:g}", f"--entry-timeout={cache_s:g}",
                 f"--negative-timeout={cache_s:g}"]
    return [*argv, target]


def _client_pid(target: str) -> int | None:
    for line in subprocess.run(["pgrep", "-a", "-x", "glusterfs"], capture_output=True, text=True).stdout.splitlines():
        pid, _, cmd = line.partition(" ")
        if cmd.split()[-1:] == [target]:
            return int(pid)
    return None


def mounted(target: str) -> bool:
    """Whether `target` is a mount point, a dead one included: os.path.ismount stats it, and the mount of a
    FUSE client that died answers ENOTCONN ("Transport endpoint is not connected"), so it looks unmounted."""
    with open("/proc/self/mountinfo") as f:
        points = {re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4]) for line in f}
    return os.path.abspath(target) in points


def _processes_naming(text: str) -> list[str]:
    out = subprocess.run(["pgrep", "-a", "-f", text], capture_output=True, text=True).stdout.splitlines()
    return [line for line in out if int(line.split()[0]) != os.getpid()]


def up(root: Path | str, *, clients: int = 3, cache_s: float | None = None) -> Volume:
    """A one-brick volume under `root`, mounted `clients` times (root/client-0 ...)."""
    why = missing()
    if why:
        raise GlusterError(why)
    if clients < 1:
        raise ValueError(f"clients must be at least 1, got {clients}")
    root = Path(root).resolve()
    if (root / STATE).exists():
        raise GlusterError(f"{root} holds a volume already ({root / STATE}): run down on it first")
    root.mkdir(parents=True, exist_ok=True)
    # The random part: one process's two volumes made within a second had the same name, and the second's
    # create failed with "already exists" (CI, test_shared_fs beside its module's volume)
    vol = Volume(name=f"agentrl-{os.getpid()}-{int(time.time())}-{secrets.token_hex(3)}", root=str(root),
                 clients=[str(root / f"client-{i}") for i in range(clients)], cache_s=cache_s)
    vol.glusterd_pid = _start_glusterd()
    vol.save()       # from here on, down() undoes whatever was done
    try:
        (root / "brick").mkdir(exist_ok=True)
        # force: the brick is on the root filesystem, which gluster refuses by default. The brick's directory is
        # the volume's own: a volume left in glusterd's state (its down found no glusterd) keeps its path.
        _cli("volume", "create", vol.name, f"{socket.gethostname()}:{root / 'brick' / vol.name}", "force")
        _cli("volume", "start", vol.name)
        for target in vol.clients:
            # A client that died (killed, or its machine's namespace kept from a run before) leaves its mount
            # point dead: makedirs would fail on it with "File exists" (CI, cluster up after such a run)
            if mounted(target):
                subprocess.run(["umount", "-l", target], capture_output=True, timeout=60)
            os.makedirs(target, exist_ok=True)
            r = subprocess.run(mount_argv(vol.name, target, cache_s), capture_output=True, text=True, timeout=60)
            if r.returncode != 0 or not os.path.ismount(target):
                raise GlusterError(f"mounting {vol.name} at {target} failed: {(r.stderr or r.stdout).strip()}")
            vol.client_pids.append(_client_pid(target) or 0)
            vol.save()
    except BaseException:
        down(root)
        raise
    return vol


def down(root: Path | str) -> None:
    """Unmount, stop and delete what `up` made under `root`; stop glusterd if `up` started it."""
    root = Path(root).resolve()
    try:
        vol = Volume.load(root)
    except FileNotFoundError:
        return
    for target, pid in zip(vol.clients, [*vol.client_pids, *[0] * len(vol.clients)], strict=False):
        if mounted(target):
            subprocess.run(["umount", "-l", target], capture_output=True, timeout=60)
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    # A glusterd stopped since `up` (another volume's `down` stops the one it started) leaves this volume's
    # brick running and the volume in its state: start one to stop and delete it, and stop that one after.
    started_here = _start_glusterd()
    for args in (("volume", "stop", vol.name, "force"), ("volume", "delete", vol.name)):
        subprocess.run(["gluster", "--mode=script", *args], capture_output=True, timeout=60)
    # glusterd runs its hook scripts for the volume's stop and delete after answering: wait for them
    deadline = time.monotonic() + 15
    while _processes_naming(vol.name) and time.monotonic() < deadline:
        time.sleep(0.1)
    for daemon in (vol.glusterd_pid, started_here):
        if daemon and pid_alive(daemon):
            os.kill(daemon, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while pid_alive(daemon) and time.monotonic() < deadline:
                time.sleep(0.1)
    shutil.rmtree(root / "brick", ignore_errors=True)
    (root / STATE).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpc.localcluster.glusterfs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--clients", type=int, default=3, help="mounts, one per simulated node (default 3)")
    ap.add_argument("--cache-s", type=float, default=None,
                    help="the mounts' attribute, entry and negative cache timeouts (default: GlusterFS's)")
    args = ap.parse_args(argv)
    try:
        if args.action == "up":
            vol = up(args.dir, clients=args.clients, cache_s=args.cache_s)
            print(f"glusterfs: volume {vol.name} mounted at {', '.join(vol.clients)}")
        else:
            down(args.dir)
            print(f"glusterfs: {args.dir} is down")
    except (GlusterError, ValueError) as e:
        print(f"glusterfs: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
