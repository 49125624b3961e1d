"""What a sandboxed process may do: its uids on the host, its capabilities, its system calls, its limits.

Pure data and pure functions (the supervisor applies them; tests read them):
- Every sandbox has a user namespace of its own that maps its uids 0..65535 onto a range of
  unprivileged host uids no one else uses (one range per sandbox on a node, so two sandboxes'
  agents are different host users as well as in different namespaces). The grader's root is
  root of that namespace only: host uid `base`, with no power over the host.
- Root keeps a short list of capabilities (what package managers and test suites use: chown,
  file ownership, setuid to drop privileges); the rest leave the bounding set.
- A seccomp filter (libseccomp) refuses, with EPERM, the calls that reach the kernel's shared
  state: mounts, device nodes, modules, keyrings, bpf, perf, reboot, clocks, swap, and new
  namespaces (which would hand an agent a fresh set of capabilities).
"""

from __future__ import annotations

import errno
import stat
from dataclasses import dataclass

from .linux import CAPABILITIES, NAMESPACE_FLAGS

_S_IFMT = 0o170000               # the file type bits of a mode (stat.S_IFMT is a function)
UID_RANGE = 65536               # uids 0..65535 inside every sandbox
UID_BASE = 1 << 30              # first host uid of slot 0; slot k starts at UID_BASE + k * UID_RANGE
MAX_SLOTS = 1024                # sandboxes at once on one node
SLOTS_DIR = "/run/agentrl/uid-slots"   # one lock file per slot, held by the sandbox's supervisor

ROOT_CAPS = frozenset(CAPABILITIES[name] for name in (
    "chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap", "setfcap",
    "net_bind_service", "sys_chroot", "audit_write"))

DENIED_SYSCALLS = (
    # mounts: nothing in a sandbox changes its file system tree
    "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr",
    # the kernel itself
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "iopl", "ioperm",
    # shared kernel state and attack surface
    "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd", "lookup_dcookie",
    "open_by_handle_at", "name_to_handle_at",
    # clocks
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    # namespaces: a new user namespace would come with every capability in it
    "unshare", "setns",
)


@dataclass(frozen=True)
class UidRange:
    """Host uids of one sandbox: inside uid u is host uid base + u."""

    slot: int

    @property
    def base(self) -> int:
        return UID_BASE + self.slot * UID_RANGE

    def host(self, inside: int) -> int:
        if not 0 <= inside < UID_RANGE:
            raise ValueError(f"uid {inside} is outside the sandbox's range 0..{UID_RANGE - 1}")
        return self.base + inside

    def id_map(self) -> str:
        """The text of /proc/PID/uid_map (and gid_map): `inside host count`."""
        return f"0 {self.base} {UID_RANGE}\n"


def seccomp_filter():
    """The sandbox's filter as a libseccomp SyscallFilter (Debian: python3-seccomp)."""
    try:
        import seccomp  # noqa: PLC0415  (only the supervisor, on the system Python, needs it)
    except ImportError:
        raise RuntimeError("libseccomp's Python binding is missing for the sandbox supervisor's Python "
                           "(Debian: apt-get install python3-seccomp)") from None

    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        try:
            f.add_rule(deny, name)
        except (RuntimeError, ValueError):   # a call this kernel/libseccomp does not know
            continue
    # Device nodes only: FIFOs and sockets made with mknod are ordinary.
    for kind in (stat.S_IFCHR, stat.S_IFBLK):
        f.add_rule(deny, "mknod", seccomp.Arg(1, seccomp.MASKED_EQ, _S_IFMT, kind))
        f.add_rule(deny, "mknodat", seccomp.Arg(2, seccomp.MASKED_EQ, _S_IFMT, kind))
    # clone with a namespace flag; clone3 passes its flags in memory the filter cannot read, so it
    # answers ENOSYS and the C library falls back to clone (what container runtimes do).
    for flag in NAMESPACE_FLAGS:
        f.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    return f



def oci_seccomp_profile() -> dict:
    """The same filter as an OCI (Docker-format) seccomp profile, for `apptainer --security seccomp:FILE`."""
    deny = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    rules = [{"names": list(DENIED_SYSCALLS), **deny}]
    for name, index in (("mknod", 1), ("mknodat", 2)):
        for kind in (stat.S_IFCHR, stat.S_IFBLK):
            rules.append({"names": [name], **deny,
                          "args": [{"index": index, "value": _S_IFMT, "valueTwo": kind, "op": "SCMP_CMP_MASKED_EQ"}]})
    for flag in NAMESPACE_FLAGS:
        rules.append({"names": ["clone"], **deny,
                      "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]})
    rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    return {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules}


def dropped_capabilities(keep: frozenset[int] = ROOT_CAPS) -> list[str]:
    """CAP_* names outside `keep` (apptainer --drop-caps)."""
    return [f"CAP_{name.upper()}" for name, n in sorted(CAPABILITIES.items(), key=lambda kv: kv[1]) if n not in keep]


@dataclass(frozen=True)
class Limits:
    """What one sandbox may take. None: not limited (the node's own limits apply)."""

    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None        # its writable layers and HOME together
    pids: int | None = 1024              # processes and threads
    tmp_mb: int | None = None            # /tmp (RAM); default: half the memory limit, else 1024

    def __post_init__(self):
        for name in ("cpus", "memory_mb", "storage_mb", "pids", "tmp_mb"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"sandbox limit {name} must be positive, got {v!r}")
        if self.memory_mb and self.tmp_mb and self.tmp_mb >= self.memory_mb:
            raise ValueError(f"sandbox limit tmp_mb ({self.tmp_mb}) must be below memory_mb ({self.memory_mb}): /tmp "
                             "is RAM that counts against the memory limit, and a full /tmp would leave its "
                             "processes nothing. Lower tmp_mb (the default is half of memory_mb)")

    @property
    def tmp_bytes(self) -> int:
        mb = self.tmp_mb or (max(self.memory_mb // 2, 1) if self.memory_mb else 1024)
        return mb << 20


def cgroup_v1_settings(limits: Limits) -> dict[str, dict[str, str]]:
    """controller -> {file: value} for a cgroup v1 hierarchy."""
    out: dict[str, dict[str, str]] = {}
    if limits.memory_mb:
        out["memory"] = {"memory.limit_in_bytes": str(limits.memory_mb << 20)}
    if limits.pids:
        out["pids"] = {"pids.max": str(limits.pids)}
    if limits.cpus:
        out["cpu"] = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(int(limits.cpus * 100000))}
    return out
