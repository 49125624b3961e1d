import pytest

from hpc.records import RecordError
from hpc.registry import Registry


def test_register_heartbeat_and_liveness(tmp_path):
    now = [100.0]
    reg = Registry(tmp_path / "services", clock=lambda: now[0])
    inf = reg.register("inference", 0, host="gpu1", port=30000, weight_version=0)
    pool = reg.register("pool", 1, host="cpu1", socket="/tmp/adapter.sock")
    assert [r.role for r in reg.services()] == ["inference", "pool"]
    assert reg.services("pool")[0].socket == "/tmp/adapter.sock"
    assert reg.services()[0].writer.pid > 0

    now[0] = 125.0
    inf = reg.heartbeat(inf, weight_version=3)
    now[0] = 140.0
    alive = reg.alive(ttl_s=30)
    assert [(r.role, r.weight_version) for r in alive] == [("inference", 3)]  # pool's heartbeat is 40 s old
    reg.deregister(pool)
    assert [r.role for r in reg.services()] == ["inference"]


def test_bad_registrations_and_records(tmp_path):
    reg = Registry(tmp_path)
    with pytest.raises(ValueError, match="role 'Bad Role'"):
        reg.register("Bad Role", 0, host="h")
    with pytest.raises(ValueError, match="port 70000"):
        reg.register("pool", 0, host="h", port=70000)
    (tmp_path / "pool-0.json").write_text("{")
    (tmp_path / ".pool-1.json.tmp-h-1-x").write_text("")  # a writer's temp file is skipped
    with pytest.raises(RecordError, match="pool-0.json"):
        reg.services()


def test_a_record_that_cannot_be_opened_for_now_stands_in_as_last_read(tmp_path, monkeypatch):
    """A network filesystem's client may fail to open a name whose file another node just replaced
    (ESTALE): the record this reader last read stands in, its heartbeat as old as it is."""
    import errno
    from pathlib import Path
    now = [100.0]
    reg = Registry(tmp_path, clock=lambda: now[0])
    reg.heartbeat(reg.register("inference", 0, host="gpu1", port=30000))
    assert [r.heartbeat for r in reg.alive(ttl_s=30)] == [100.0]
    real = Path.read_bytes

    def stale(path):
        raise OSError(errno.ESTALE, "Stale file handle")
    monkeypatch.setattr(Path, "read_bytes", stale)
    now[0] = 120.0
    assert [r.heartbeat for r in reg.alive(ttl_s=30)] == [100.0]
    now[0] = 131.0
    assert reg.alive(ttl_s=30) == []                        # as old as it is: dead past the ttl
    assert Registry(tmp_path).services() == []              # a reader that never read it: absent for now
    monkeypatch.setattr(Path, "read_bytes", real)
    assert len(Registry(tmp_path).services()) == 1
