import os
from typing import Literal

import pytest

from hpc.environment import SlurmEnv, Writer
from hpc.fsio import write_atomic, write_new
from hpc.records import Record, RecordError, create_record, read_record, write_record
from hpc.runlayout import RunDirError, RunLayout


class Note(Record):
    kind: Literal["note"] = "note"
    schema_version: int = 2
    text: str


def test_record_round_trip_names_its_writer(tmp_path):
    p = tmp_path / "n.json"
    write_record(p, Note(text="hi"))
    rec = read_record(p, Note)
    assert rec.text == "hi"
    assert rec.writer.pid == os.getpid() and rec.writer.host


@pytest.mark.parametrize("content, words", [
    (b"", "empty"),
    (b'{"kind": "note", "schema_version": 2, "te', "not valid JSON"),
    (b'[1, 2]', "holds a list"),
    (b'{"kind": "other", "schema_version": 2}', "expected 'note'"),
    (b'{"kind": "note", "schema_version": 3, "text": "x"}', "upgrade agentrl-hpc"),
    (b'{"kind": "note", "schema_version": 1, "text": "x"}', "incompatible version"),
    (b'{"kind": "note", "schema_version": 2, "text": 5, "writer": {"host": "h", "pid": 1}}', "not a valid note"),
])
def test_bad_records_are_refused_naming_the_file(tmp_path, content, words):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(RecordError) as e:
        read_record(p, Note)
    assert str(p) in str(e.value) and words in str(e.value)
    assert p.read_bytes() == content  # nothing is deleted or rewritten


def test_write_new_never_replaces_and_leaves_no_temp_files(tmp_path):
    p = tmp_path / "once"
    assert write_new(p, b"first", mtime=1000.0)
    assert not write_new(p, b"second")
    assert p.read_bytes() == b"first" and p.stat().st_mtime == 1000.0
    write_atomic(p, b"third")
    assert p.read_bytes() == b"third"
    assert sorted(os.listdir(tmp_path)) == ["once"]
    assert create_record(tmp_path / "r.json", Note(text="a"))
    assert not create_record(tmp_path / "r.json", Note(text="b"))
    assert read_record(tmp_path / "r.json", Note).text == "a"


def test_slurm_environment_is_parsed_in_one_place():
    env = SlurmEnv.from_environ({"SLURM_JOB_ID": "7", "SLURM_HET_JOB_ID": "5", "SLURM_STEP_ID": "2",
                                 "SLURM_PROCID": "3", "SLURMD_NODENAME": "cpu1"})
    assert env == SlurmEnv(job_id="5", step_id="2", proc_id=3, node="cpu1")
    assert SlurmEnv.from_environ({}) == SlurmEnv()
    assert Writer.current() is Writer.current()


def test_run_directory_create_open_and_mismatch(tmp_path):
    layout = RunLayout.create(tmp_path / "run", {"lr": 1e-6}, run_id="exp-1")
    assert layout.manifest().config == {"lr": 1e-6}
    assert layout.ledger_dir.is_dir() and layout.services_dir.is_dir()
    assert layout.rollout_buffer_dir(3) == layout.root / "buffer" / "rollout_3"
    # Creating again with the same id reopens; the manifest is never rewritten.
    again = RunLayout.create(tmp_path / "run", {"lr": 2.0}, run_id="exp-1")
    assert again.manifest().config == {"lr": 1e-6}
    with pytest.raises(RunDirError, match="holds run 'exp-1', not 'exp-2'"):
        RunLayout.create(tmp_path / "run", run_id="exp-2")
    with pytest.raises(RunDirError, match="not a run directory"):
        RunLayout.open(tmp_path)
    with pytest.raises(ValueError, match="run id"):
        RunLayout.create(tmp_path / "x", run_id="../escape")


def test_run_manifest_is_yaml_and_validated(tmp_path):
    layout = RunLayout.create(tmp_path / "run", run_id="r")
    text = layout.manifest_path.read_text()
    assert "run_id: r\n" in text  # YAML, for people to read
    layout.manifest_path.write_text("kind: run\nschema_version: 9\n")
    with pytest.raises(RecordError, match="run.yaml: has schema version 9"):
        RunLayout.open(layout.root)


def test_latest_checkpoint_pointer(tmp_path):
    layout = RunLayout.create(tmp_path / "run", run_id="r")
    assert layout.latest_checkpoint() is None
    with pytest.raises(FileNotFoundError):
        layout.publish_latest(5)
    layout.checkpoint_dir(5).mkdir(parents=True)
    layout.publish_latest(5)
    assert layout.latest_checkpoint() == 5
    (layout.checkpoints_dir / "latest").write_text("iter_five")
    with pytest.raises(RecordError, match="not an iteration number"):
        layout.latest_checkpoint()


def test_read_bytes_looks_a_name_up_again_after_an_open_through_a_stale_entry(tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    from hpc.fsio import read_bytes
    path = tmp_path / "latest"
    path.write_bytes(b"3\n")
    fails, listed, real_read, real_list = [errno.ESTALE, errno.ENOENT], [], Path.read_bytes, os.listdir

    def read(p):
        if fails:
            raise OSError(fails.pop(0), "from the client's cache")
        return real_read(p)
    monkeypatch.setattr(Path, "read_bytes", read)
    monkeypatch.setattr(os, "listdir", lambda d: listed.append(d) or real_list(d))
    assert read_bytes(path) == b"3\n" and listed == [tmp_path, tmp_path]
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "absent")
    fails.append(errno.EIO)
    with pytest.raises(OSError, match="from the client's cache"):
        read_bytes(path)
