"""The bwrap command line: building it (pure: host paths are given) and reading it back."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from .base import AGENT_GID, AGENT_UID, SOCKET_IN_SANDBOX, SandboxSpec

_USR_MERGED = ("bin", "sbin", "lib", "lib64")

ARITY = {"--bind": 2, "--ro-bind": 2, "--dev-bind": 2, "--symlink": 2, "--proc": 1, "--dev": 1, "--tmpfs": 1,
         "--dir": 1, "--hostname": 1, "--perms": 1, "--size": 1, "--info-fd": 1, "--cap-drop": 1, "--cap-add": 1,
         "--seccomp": 1, "--chdir": 1, "--setenv": 2, "--unsetenv": 1, "--uid": 1, "--gid": 1}
BINDS = ("--bind", "--ro-bind", "--dev-bind")


def options(argv: list[str]) -> Iterator[tuple[int, str, list[str]]]:
    """(index, flag, its arguments) for each option before `--` (argv[0] is bwrap itself)."""
    i = 1
    while i < len(argv) and argv[i] != "--":
        n = ARITY.get(argv[i], 0)
        yield i, argv[i], argv[i + 1:i + 1 + n]
        i += 1 + n


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
    """The bwrap command line (pure: paths on the host are given). `@INFO_FD@` is bwrap's info fd."""
    # No --unshare-user: the supervisor made the user namespace (with the whole uid range mapped,
    # so that uid 1000 owns what it writes) before bwrap runs.
    argv = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox", "--cap-drop", "ALL"]
    if rootfs_host:
        # The image's own copy-on-write layer: writable, so that bwrap can make its mount
        # points (/proc, /run/agentrl, the workdir) and the agent can install packages.
        argv += ["--bind", rootfs_host, "/"]
    else:
        if etc_host is None:
            raise ValueError("bwrap_argv: without rootfs_host (the host image), etc_host is needed")
        argv += ["--ro-bind", "/usr", "/usr"]
        for d in _USR_MERGED:
            if os.path.islink(f"/{d}"):
                argv += ["--symlink", os.readlink(f"/{d}"), f"/{d}"]
            elif os.path.isdir(f"/{d}"):
                argv += ["--ro-bind", f"/{d}", f"/{d}"]
        argv += ["--ro-bind", etc_host, "/etc", "--dir", "/root"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(spec.limits.tmp_bytes),
             "--tmpfs", "/tmp", "--dir", "/run/agentrl"]
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
    # sleep is the sandbox's pid 1 itself (--as-pid-1): the kernel ignores a SIGKILL sent to a pid
    # namespace's init from inside it, so no root of the sandbox can end it (`kill -9 -1` as root
    # would otherwise take bwrap's init with its child, and a failed grading would become a retry).
    return [*argv, "--as-pid-1", "--info-fd", "@INFO_FD@", "--", "sleep", "infinity"]


def mount_points(argv: list[str]) -> list[tuple[str, str]]:
    """(path, "dir"|"file") of every mount point bwrap makes: in an image, where the sandbox's
    root owns nothing, the supervisor makes them first."""
    out = []
    for _, flag, args in options(argv):
        if flag in BINDS and args[1] != "/":
            out.append((args[1], "dir" if os.path.isdir(args[0]) else "file"))
        elif flag in ("--proc", "--dev", "--tmpfs", "--dir"):
            out.append((args[0], "dir"))
    return out


def _parents(inside: str) -> list[str]:
    # Parents bwrap has to make for a mount point would be 0700: the agent (uid 1000) could not pass them.
    return [arg for parent in reversed(PurePosixPath(inside).parents[:-1])
            for arg in ("--perms", "0755", "--dir", str(parent))]
