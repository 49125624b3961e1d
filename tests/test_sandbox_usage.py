"""Which limits a sandbox ran into, from the kernel's counters as cgroup v1 and v2 write them (pure)."""

import pytest

from hpc.sandbox.storage import StorageError, choose
from hpc.sandbox.usage import Usage, cgroup_figures, dead

MIB = 1 << 20

# As this machine's kernel (6.18, cgroup v1) writes them, trimmed
V1 = {"memory.stat": "cache 524288000\nrss 12582912\nrss_huge 0\nshmem 268435456\nmapped_file 0\n"
                     "total_rss 12582912\n",
      "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
      "memory.limit_in_bytes": "1073741824\n", "pids.events": "max 7\n"}
V2 = {"memory.stat": "anon 12582912\nfile 524288000\nkernel 4096\nshmem 268435456\n",
      "memory.events": "low 0\nhigh 0\nmax 40\noom 3\noom_kill 2\noom_group_kill 0\n",
      "memory.max": "1073741824\n", "pids.events": "max 7\n"}


@pytest.mark.parametrize("files", [V1, V2], ids=["v1", "v2"])
def test_cgroup_counters_of_either_version_read_the_same(files):
    assert cgroup_figures(files) == {"anon": 12 * MIB, "shmem": 256 * MIB, "cache": 244 * MIB, "oom_kills": 2,
                                     "pids_refused": 7, "memory_limit": 1024 * MIB}


def test_no_limit_and_missing_files_read_as_zero():
    assert cgroup_figures({"memory.limit_in_bytes": "9223372036854771712\n"})["memory_limit"] == 0
    assert cgroup_figures({"memory.max": "max\n"}) == {"anon": 0, "shmem": 0, "cache": 0, "oom_kills": 0,
                                                      "pids_refused": 0, "memory_limit": 0}


def test_each_limit_is_named_by_its_own_counter():
    quiet = Usage(memory_limit=256 * MIB, anon=20 * MIB, cache=200 * MIB, disk_backing="disk",
                  disk_size=100 * MIB, disk_free=50 * MIB, tmp_size=128 * MIB, tmp_free=128 * MIB)
    assert quiet.limits_hit() == () and quiet.exhausted() == ()
    assert Usage(oom_kills=1).limits_hit() == ("memory",)
    # page cache is not held memory: a full cache is the kernel's to write back, not a limit hit
    assert Usage(memory_limit=256 * MIB, cache=256 * MIB).limits_hit() == ()
    held = Usage(memory_limit=256 * MIB, anon=10 * MIB, shmem=240 * MIB)
    assert held.limits_hit() == ("memory",) and held.exhausted() == ("memory",)
    assert Usage(pids_refused=3).limits_hit() == ("pids",) and Usage(pids_refused=3).exhausted() == ()
    full = Usage(disk_backing="disk", disk_size=100 * MIB, disk_free=MIB, tmp_size=64 * MIB, tmp_free=0)
    assert full.limits_hit() == ("storage", "tmp") == full.exhausted()
    # no storage_mb: the layers are the node's scratch directory, whose fill is not the sandbox's limit
    assert Usage(disk_backing="dir", disk_size=100 * MIB, disk_free=0).limits_hit() == ()


def test_a_dead_sandbox_keeps_what_was_read_as_it_died():
    assert not dead(None).alive and dead(None).limits_hit() == ()
    assert dead(Usage(oom_kills=4)).limits_hit() == ("memory",)
    assert Usage.from_json({**Usage(pids_refused=1).to_json(), "later_field": 1}) == Usage(pids_refused=1)


def test_storage_is_a_disk_image_unless_the_node_cannot(monkeypatch):
    assert choose("auto", None) == ("dir", None)
    assert choose("tmpfs", 512) == ("tmpfs", None)
    monkeypatch.setattr("hpc.sandbox.storage.disk_unsupported", lambda: None)
    assert choose("auto", 512) == ("disk", None) == choose("disk", 512)
    monkeypatch.setattr("hpc.sandbox.storage.disk_unsupported", lambda: "no loop devices on this node")
    assert choose("auto", 512) == ("tmpfs", "no loop devices on this node")
    with pytest.raises(StorageError, match="disk was asked for, but no loop devices"):
        choose("disk", 512)
    with pytest.raises(ValueError, match="one of auto, disk, tmpfs"):
        choose("ramdisk", 512)  # type: ignore[arg-type]


def test_a_pool_says_once_that_its_node_fell_back_to_tmpfs_and_not_when_tmpfs_was_asked_for(caplog):
    from types import SimpleNamespace

    from agentrl.pool.attempt import _report_limits
    fell_back = SimpleNamespace(unenforced={}, storage={"backing": "tmpfs", "why": "no loop devices on this node"})
    asked = SimpleNamespace(unenforced={}, storage={"backing": "tmpfs", "why": None})
    for sandboxes in ([fell_back, fell_back], [asked]):
        ctx = SimpleNamespace(limits_reported=False)
        caplog.clear()
        for sb in sandboxes:
            _report_limits(ctx, sb)
        said = [r.getMessage() for r in caplog.records]
        if sandboxes[0] is fell_back:
            assert len(said) == 1 and said[0].startswith("sandbox disks are tmpfs on this node (no loop devices")
            assert "pool.sandbox_storage: tmpfs" in said[0]
        else:
            assert said == []
