"""The sandbox policy as data: uid ranges, capabilities, the seccomp filter, limits, cgroups, slots."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpc.sandbox.bwrap_args import options
from hpc.sandbox.cgroups import Cgroup, own_cgroups, unenforced_message
from hpc.sandbox.layout import STAGE_DIR, stage_binds
from hpc.sandbox.linux import CAPABILITIES
from hpc.sandbox.policy import (
    DENIED_SYSCALLS,
    ROOT_CAPS,
    UID_BASE,
    UID_RANGE,
    Limits,
    UidRange,
    cgroup_v1_settings,
    dropped_capabilities,
    oci_seccomp_profile,
)
from hpc.sandbox.supervisor import take_slot

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


def test_uid_ranges_are_unprivileged_and_disjoint():
    a, b = UidRange(0), UidRange(1)
    assert a.base == UID_BASE > 65535 and b.base == a.base + UID_RANGE
    assert a.host(0) == a.base and a.host(1000) == a.base + 1000 and a.host(65535) < b.host(0)
    assert a.id_map() == f"0 {UID_BASE} 65536\n"
    with pytest.raises(ValueError, match="outside the sandbox's range"):
        a.host(65536)


def test_root_keeps_only_what_grading_needs():
    kept = {n for n, c in CAPABILITIES.items() if c in ROOT_CAPS}
    assert {"chown", "dac_override", "setuid", "setgid", "fowner"} <= kept
    assert not {"sys_admin", "mknod", "sys_module", "sys_rawio", "net_admin", "sys_ptrace", "bpf"} & kept
    assert set(dropped_capabilities()) == {f"CAP_{n.upper()}" for n in CAPABILITIES if n not in kept}


def test_the_oci_profile_denies_what_the_libseccomp_filter_denies():
    prof = oci_seccomp_profile()
    assert prof["defaultAction"] == "SCMP_ACT_ALLOW"
    names = {n for rule in prof["syscalls"] for n in rule["names"]}
    assert set(DENIED_SYSCALLS) | {"mknod", "mknodat", "clone", "clone3"} == names
    mknod = [r for r in prof["syscalls"] if r["names"] == ["mknod"]]
    assert {r["args"][0]["valueTwo"] for r in mknod} == {0o020000, 0o060000}     # char and block only


@pytest.mark.skipif(subprocess.run(["/usr/bin/python3", "-c", "import seccomp"], capture_output=True).returncode,
                    reason="needs Debian's python3-seccomp (make sysdeps)")
def test_the_filter_compiles_with_libseccomp_and_refuses_in_a_child():
    probe = (
        "import ctypes, os, sys\n"
        "from hpc.sandbox.policy import seccomp_filter\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setuid(65534) if os.getuid() == 0 else None\n"
        "    import hpc.sandbox.linux as l; l.no_new_privs(); seccomp_filter().load()\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    r = libc.unshare(0x10000000); e = ctypes.get_errno()\n"
        "    p = '/tmp/agentrl-probe-fifo'\n"
        "    try: os.mknod(p, 0o600 | 0o010000); os.unlink(p); f = 'ok'\n"
        "    except OSError as ex: f = str(ex.errno)\n"
        "    print(r, e, f, flush=True); os._exit(0)\n"
        "os.waitpid(pid, 0)\n")
    r = subprocess.run(["/usr/bin/python3", "-c", probe], capture_output=True, text=True, cwd=REPO,
                       env={"PYTHONPATH": str(REPO)}, timeout=30)
    assert r.stdout.split() == ["-1", "1", "ok"], r.stderr        # unshare: EPERM; a FIFO is fine


def test_limits_validate_and_size_tmp():
    assert Limits(memory_mb=2048).tmp_bytes == 1024 << 20
    assert Limits().tmp_bytes == 1024 << 20 and Limits(tmp_mb=10).tmp_bytes == 10 << 20
    with pytest.raises(ValueError, match="memory_mb must be positive"):
        Limits(memory_mb=0)
    assert Limits(memory_mb=64).tmp_bytes == 32 << 20      # /tmp is RAM: half the memory, never all of it
    with pytest.raises(ValueError, match=r"tmp_mb \(512\) must be below memory_mb \(512\)"):
        Limits(memory_mb=512, tmp_mb=512)
    assert cgroup_v1_settings(Limits(memory_mb=1, pids=5, cpus=1.5)) == {
        "memory": {"memory.limit_in_bytes": str(1 << 20)}, "pids": {"pids.max": "5"},
        "cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "150000"}}


def test_cgroups_report_what_a_node_cannot_enforce(tmp_path):
    own_memory = own_cgroups(Path("/proc/self/cgroup").read_text())["memory"].lstrip("/")
    (tmp_path / "memory" / own_memory).mkdir(parents=True)     # a v1 node with only the memory controller
    cg = Cgroup.create("agentrl-sandbox.1.0", Limits(memory_mb=64, pids=10), root=tmp_path)
    assert (tmp_path / "memory" / own_memory / "agentrl-sandbox.1.0" / "memory.limit_in_bytes").read_text() \
        == str(64 << 20)
    assert set(cg.unenforced) == {"pids"} and "no cgroup v1 pids controller" in cg.unenforced["pids"]
    msg = unenforced_message(cg.unenforced)
    assert "pids" in msg and "To enforce them" in msg
    cg.dirs = []      # not a real cgroup fs: nothing to rmdir
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("memory pids\n")
    (v2 / "cgroup.subtree_control").write_text("memory\n")
    own = own_cgroups(Path("/proc/self/cgroup").read_text()).get("", "/").lstrip("/")
    (v2 / own).mkdir(parents=True, exist_ok=True)
    if own:
        (v2 / own / "cgroup.subtree_control").write_text("memory\n")
    cg2 = Cgroup.create("s", Limits(memory_mb=64, pids=10), root=v2)
    assert set(cg2.unenforced) == {"pids"} and "not delegated" in cg2.unenforced["pids"]


def test_bind_sources_are_staged_where_the_sandbox_root_can_pass():
    argv = ["bwrap", "--bind", "/root/x/work", "/testbed", "--ro-bind", "/usr", "/usr", "--dir", "/tmp",
            "--info-fd", "7", "--", "sleep", "infinity"]
    staged, pairs = stage_binds(argv)
    assert pairs == [("/root/x/work", f"{STAGE_DIR}/0"), ("/usr", f"{STAGE_DIR}/1")]
    assert staged[2] == f"{STAGE_DIR}/0" and staged[3] == "/testbed" and staged[-3:] == argv[-3:]
    assert [f for _, f, _ in options(argv)] == ["--bind", "--ro-bind", "--dir", "--info-fd"]


def test_slots_are_held_by_a_lock_and_freed_when_its_holder_dies(tmp_path):
    slot, fd = take_slot(str(tmp_path))
    holder = subprocess.Popen(["python3", "-c", "import sys, time; sys.path.insert(0, sys.argv[1]);"
                               "from hpc.sandbox.supervisor import take_slot; print(take_slot(sys.argv[2])[0],"
                               " flush=True); time.sleep(60)", str(REPO), str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    other = int(holder.stdout.readline())
    assert other != slot
    holder.kill()
    holder.wait()
    again, fd2 = take_slot(str(tmp_path))
    assert again == other                 # its lock went with it
    os.close(fd)
    os.close(fd2)


def test_supervisor_imports_only_the_standard_library():
    """It runs on the system Python, which has none of the project's dependencies."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import hpc.sandbox.supervisor; "
            "print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
            "{'pydantic','numpy','httpx','torch','fastapi','yaml'}))")
    r = subprocess.run([shutil.which("python3"), "-S", "-c", code, str(REPO)], capture_output=True, text=True)
    assert r.stdout.strip() == "[]", r.stderr


def test_the_pool_says_once_which_limits_a_node_cannot_enforce(caplog):
    from types import SimpleNamespace

    from agentrl.pool.attempt import _report_limits
    ctx = SimpleNamespace(limits_reported=False)
    why = "no cgroup v1 memory controller mounted at /sys/fs/cgroup/memory"
    sandbox = SimpleNamespace(unenforced={"memory_mb": why})
    with caplog.at_level("WARNING", logger="agentrl.pool"):
        _report_limits(ctx, sandbox)
        _report_limits(ctx, sandbox)
    (record,) = caplog.records
    msg = record.getMessage()
    assert f"memory_mb ({why})" in msg and "To enforce them" in msg
