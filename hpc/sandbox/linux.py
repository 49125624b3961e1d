"""The few Linux calls the sandbox supervisor needs that Python 3.10/3.11's os module lacks.

unshare, setns, prctl and the capability bounding set, through libc with ctypes: thin, each
raising OSError with the errno, so callers see "setns: Operation not permitted" and not a 0/-1.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080
NAMESPACE_FLAGS = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
                   CLONE_NEWNET, CLONE_NEWTIME)

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

# linux/capability.h: the numbers the bounding set is indexed by.
CAPABILITIES = {
    "chown": 0, "dac_override": 1, "dac_read_search": 2, "fowner": 3, "fsetid": 4, "kill": 5, "setgid": 6,
    "setuid": 7, "setpcap": 8, "linux_immutable": 9, "net_bind_service": 10, "net_broadcast": 11,
    "net_admin": 12, "net_raw": 13, "ipc_lock": 14, "ipc_owner": 15, "sys_module": 16, "sys_rawio": 17,
    "sys_chroot": 18, "sys_ptrace": 19, "sys_pacct": 20, "sys_admin": 21, "sys_boot": 22, "sys_nice": 23,
    "sys_resource": 24, "sys_time": 25, "sys_tty_config": 26, "mknod": 27, "lease": 28, "audit_write": 29,
    "audit_control": 30, "setfcap": 31, "mac_override": 32, "mac_admin": 33, "syslog": 34, "wake_alarm": 35,
    "block_suspend": 36, "audit_read": 37, "perfmon": 38, "bpf": 39, "checkpoint_restore": 40,
}

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(name: str, rc: int) -> int:
    if rc == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")
    return rc


MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18


def mount(source: str, target: str, fstype: str | None = None, flags: int = 0, data: str | None = None) -> None:
    """mount(2): one system call where mount(8) would be a process (the sandbox's start makes several)."""
    rc = _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                     data.encode() if data else None)
    if rc == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or ''} {source} on {target}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check("unshare", _libc.unshare(ctypes.c_int(flags)))


def setns(fd: int, nstype: int = 0) -> None:
    _check("setns", _libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)))


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _check("prctl", _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3),
                                       ctypes.c_ulong(arg4), ctypes.c_ulong(arg5)))


PR_SET_NAME = 15


def set_name(name: str) -> None:
    """The process's name as `ps -o comm` shows it (15 bytes at most)."""
    buf = ctypes.create_string_buffer(name.encode()[:15])
    _check("prctl", _libc.prctl(ctypes.c_int(PR_SET_NAME), buf, 0, 0, 0))


def last_cap() -> int:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        return int(f.read())


def drop_bounding_set(keep: frozenset[int]) -> None:
    """Every capability not in `keep` leaves the bounding set: no exec can regain it."""
    for cap in range(last_cap() + 1):
        if cap not in keep:
            prctl(PR_CAPBSET_DROP, cap)
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)


def no_new_privs() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def die_with_parent(sig: int) -> None:
    prctl(PR_SET_PDEATHSIG, sig)
