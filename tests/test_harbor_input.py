"""Task input is hostile: conversion stays inside the task directory, reads only regular files of a bounded
size, writes strict JSON; loading and materializing a JSONL keeps every payload under its directory."""

import base64
import gzip
import json
import os
import threading
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.swe import task_tree
from agentrl.swe.harbor import BUNDLED_TASKS, convert_task, render_jsonl
from agentrl.swe.loaded import load_record, materialize
from agentrl.swe.task import (
    MAX_FILE_BYTES,
    TaskSpecError,
    check_payload_path,
    encode_payload,
    load_task_spec,
    payload_path_problem,
)
from agentrl.swe.task_tree import HarborTaskError, TaskTree

pytestmark = pytest.mark.timeout(60)

BUNDLED = sorted(p for p in BUNDLED_TASKS.iterdir() if (p / "task.toml").exists())

TOML = b"""[agent]
timeout_sec = 300.0
[verifier]
timeout_sec = 90
[environment]
docker_image = "swebench/sweb.eval.x86_64.demo:latest"
workdir = "/testbed"
cpus = 2
memory = "4G"
"""
HOST_TOML = TOML.replace(b"swebench/sweb.eval.x86_64.demo:latest", b"host")


def make_task(root: Path, name: str = "t", toml: bytes = TOML) -> Path:
    t = root / name
    for d in ("environment/repo", "tests", "solution"):
        (t / d).mkdir(parents=True)
    (t / "instruction.md").write_bytes(b"Fix the bug.\n")
    (t / "task.toml").write_bytes(toml)
    (t / "tests" / "test.sh").write_bytes(b"#!/bin/bash\nexit 0\n")
    (t / "tests" / "helper.py").write_bytes(b"X = 1\n")
    (t / "solution" / "solve.sh").write_bytes(b"#!/bin/bash\ntrue\n")
    (t / "environment" / "repo" / "app.py").write_bytes(b"print(1)\n")
    return t


def refused(task: Path, named: Path, *words: str) -> str:
    with pytest.raises(HarborTaskError) as e:
        convert_task(task)
    msg = str(e.value)
    assert msg.startswith(f"{named}:"), msg
    for w in words:
        assert w in msg, msg
    return msg


@pytest.fixture
def secret(tmp_path) -> Path:
    s = tmp_path / "outside" / "secret.txt"
    s.parent.mkdir()
    s.write_text("TOP SECRET\n")
    return s


# --- symlinks ---------------------------------------------------------------------------------------------------

FILES = ["instruction.md", "task.toml", "tests/test.sh", "tests/config.json", "tests/helper.py",
         "solution/solve.sh", "environment/Dockerfile", "environment/repo/app.py"]


@pytest.mark.parametrize("rel", FILES)
def test_a_symlink_out_of_the_task_is_refused_by_name(tmp_path, secret, rel):
    t = make_task(tmp_path / "ds", toml=HOST_TOML)
    f = t / rel
    f.unlink(missing_ok=True)
    f.symlink_to(secret)
    msg = refused(t, f, "is a symlink to", str(secret), "outside the task directory", "copy the file into the task")
    assert "TOP SECRET" not in msg


def test_a_relative_symlink_to_etc_passwd_is_refused(tmp_path):
    t = make_task(tmp_path)
    (t / "tests" / "test.sh").unlink()
    depth = len(t.resolve().parts) + 1
    (t / "tests" / "test.sh").symlink_to("../" * depth + "etc/passwd")
    refused(t, t / "tests" / "test.sh", "/etc/passwd", "outside the task directory")


def test_a_symlink_to_dev_zero_is_refused_without_reading_it(tmp_path):
    t = make_task(tmp_path)
    (t / "instruction.md").unlink()
    (t / "instruction.md").symlink_to("/dev/zero")
    refused(t, t / "instruction.md", "/dev/zero", "outside the task directory")


@pytest.mark.parametrize("rel", ["tests/data", "environment/repo", "tests"])
def test_a_symlinked_directory_out_of_the_task_is_not_walked(tmp_path, secret, rel):
    t = make_task(tmp_path / "ds", toml=HOST_TOML)
    d = t / rel
    if rel == "tests":  # tests/test.sh is read through it first: named as the file, resolving outside
        os.rename(d, tmp_path / "moved-tests")
        d.symlink_to(tmp_path / "moved-tests")
        refused(t, t / "tests" / "test.sh", "resolves to", "outside the task directory", "copy the files")
        return
    if d.exists():
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    d.symlink_to(secret.parent, target_is_directory=True)
    refused(t, d, "is a symlink to", "outside the task directory")


def test_symlinks_that_stay_inside_the_task_are_followed(tmp_path):
    t = make_task(tmp_path, toml=HOST_TOML)
    (t / "tests" / "solve_copy.sh").symlink_to("../solution/solve.sh")
    (t / "shared").mkdir()
    (t / "shared" / "lib.py").write_bytes(b"LIB = 2\n")
    (t / "tests" / "lib").symlink_to("../shared", target_is_directory=True)
    (t / "environment" / "repo" / "__pycache__").mkdir()
    (t / "environment" / "repo" / "__pycache__" / "app.cpython-311.pyc").write_bytes(b"\x00")
    rec = load_record(convert_task(t))
    assert rec.tests["solve_copy.sh"] == b"#!/bin/bash\ntrue\n"
    assert rec.tests["lib/lib.py"] == b"LIB = 2\n"
    assert set(rec.testbed) == {"app.py"}


def test_a_symlink_loop_is_refused(tmp_path):
    t = make_task(tmp_path)
    (t / "tests" / "sub").mkdir()
    (t / "tests" / "sub" / "loop").symlink_to("..", target_is_directory=True)
    refused(t, t / "tests" / "sub" / "loop", "same directory as", "replace the symlink")


def test_a_dangling_symlink_is_named(tmp_path):
    t = make_task(tmp_path)
    (t / "tests" / "config.json").symlink_to("nowhere.json")
    refused(t, t / "tests" / "config.json", "which does not exist")


# --- non-regular files ------------------------------------------------------------------------------------------

def _convert_with_deadline(task: Path, fifo: Path, seconds: float = 10.0):
    """convert_task in a thread: a FIFO that blocks fails the test instead of hanging the suite."""
    box: dict = {}

    def go():
        try:
            box["result"] = convert_task(task)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e
    th = threading.Thread(target=go, daemon=True)
    th.start()
    th.join(seconds)
    if th.is_alive():  # unblock the reader so the thread can end, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        th.join(5)
        pytest.fail(f"converting {task} blocked on the FIFO {fifo}")
    return box


@pytest.mark.parametrize("rel", ["instruction.md", "task.toml", "tests/test.sh", "tests/config.json",
                                 "tests/pipe", "environment/repo/pipe"])
def test_a_fifo_is_refused_and_never_opened_for_a_blocking_read(tmp_path, rel):
    t = make_task(tmp_path, toml=HOST_TOML)
    f = t / rel
    f.unlink(missing_ok=True)
    os.mkfifo(f)
    box = _convert_with_deadline(t, f)
    e = box.get("error")
    assert isinstance(e, HarborTaskError), box
    assert str(e).startswith(f"{f}:") and "named pipe (FIFO)" in str(e) and "regular file" in str(e), str(e)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_a_device_node_inside_the_task_is_refused(tmp_path):
    t = make_task(tmp_path)
    dev = t / "tests" / "zero"
    os.mknod(dev, 0o600 | 0o020000, os.makedev(1, 5))  # S_IFCHR: /dev/zero's numbers
    refused(t, dev, "character device", "not a regular file")


def test_a_directory_where_a_file_belongs_is_refused(tmp_path):
    t = make_task(tmp_path)
    (t / "instruction.md").unlink()
    (t / "instruction.md").mkdir()
    refused(t, t / "instruction.md", "is a directory, not a regular file")


# --- sizes ------------------------------------------------------------------------------------------------------

def test_a_file_over_the_limit_is_refused_without_reading_it(tmp_path):
    t = make_task(tmp_path)
    big = t / "tests" / "big.bin"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk, no time
    refused(t, big, f"over the {MAX_FILE_BYTES // 2**20} MiB limit", str(MAX_FILE_BYTES + 1))
    big.unlink()
    with open(t / "instruction.md", "ab") as f:
        f.truncate(10 * 2**30)
    refused(t, t / "instruction.md", "16 MiB limit")


def test_a_file_exactly_at_the_limit_is_read(tmp_path):
    f = tmp_path / "f.bin"
    with open(f, "wb") as fh:
        fh.truncate(4096)
    assert len(TaskTree(tmp_path, max_file_bytes=4096).read_bytes(f)) == 4096
    with pytest.raises(HarborTaskError, match="4097 bytes, over the 0.00390625 MiB limit"):
        with open(f, "ab") as fh:
            fh.write(b"x")
        TaskTree(tmp_path, max_file_bytes=4096).read_bytes(f)


def test_the_total_per_task_is_limited(tmp_path, monkeypatch):
    monkeypatch.setattr(task_tree, "MAX_TASK_BYTES", 1000)
    t = make_task(tmp_path)
    (t / "tests" / "a.bin").write_bytes(b"a" * 600)
    (t / "tests" / "b.bin").write_bytes(b"b" * 600)
    refused(t, t / "tests" / "b.bin", "past 0.000953674 MiB, the limit for one task")


# --- numbers and workdir ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("old, new, key", [
    (b"timeout_sec = 300.0", b"timeout_sec = inf", "[agent] timeout_sec"),
    (b"timeout_sec = 300.0", b"timeout_sec = nan", "[agent] timeout_sec"),
    (b"timeout_sec = 90", b"timeout_sec = +inf", "[verifier] timeout_sec"),
    (b"cpus = 2", b"cpus = inf", "[environment] cpus"),
    (b"cpus = 2", b"cpus = nan", "[environment] cpus"),
    (b'memory = "4G"', b"memory_mb = inf", "[environment] memory_mb"),
    (b'memory = "4G"', b'memory = "infG"', "[environment] memory"),
    (b'memory = "4G"', b'memory = "1e999M"', "[environment] memory"),
    (b'workdir = "/testbed"', b'workdir = "/"', "[environment] workdir"),
    (b'workdir = "/testbed"', b'workdir = "//"', "[environment] workdir"),
    (b'workdir = "/testbed"', b'workdir = "/testbed/.."', "[environment] workdir"),
])
def test_non_finite_numbers_and_a_root_workdir_are_refused(tmp_path, old, new, key):
    t = make_task(tmp_path, toml=TOML.replace(old, new))
    msg = refused(t, t / "task.toml", key)
    assert "Traceback" not in msg


def test_task_name_must_be_a_string(tmp_path):
    t = make_task(tmp_path, toml=TOML + b"[task]\nname = inf\n")
    refused(t, t / "task.toml", "[task] name must be a string")


def test_the_jsonl_writer_never_emits_nan_or_infinity():
    with pytest.raises(ValueError):
        render_jsonl([{"x": float("inf")}])
    with pytest.raises(ValueError):
        render_jsonl([{"x": float("nan")}])


@pytest.mark.parametrize("over, field", [
    ({"workdir": "/"}, "workdir"),
    ({"workdir": "/a/../"}, "workdir"),
    ({"timeouts": {"agent_s": float("inf"), "eval_s": 30}}, "timeouts.agent_s"),
    ({"timeouts": {"agent_s": 60, "eval_s": float("nan")}}, "timeouts.eval_s"),
])
def test_task_spec_refuses_a_root_workdir_and_non_finite_timeouts(over, field):
    data = {"instance_id": "t1", "image": "host", "workdir": "/testbed", "prompt": "fix it",
            "eval_command": ["bash", "/tests/test.sh"], "timeouts": {"agent_s": 60, "eval_s": 30}, **over}
    with pytest.raises(TaskSpecError, match=f"task: {field}:"):
        load_task_spec(data)


# --- JSONL payload keys -----------------------------------------------------------------------------------------

BAD_KEYS = ["../../x", "a/../../x", "/etc/x", "", "..", "a/./b", "a//b", "a/", "./a", "a\0b"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_payload_path_validator(key):
    assert payload_path_problem(key) is not None
    with pytest.raises(TaskSpecError, match="payload keys must be relative paths"):
        check_payload_path(key, "here")
    assert payload_path_problem("src/pkg/a.py") is None and payload_path_problem(".github/x.yml") is None


@pytest.mark.parametrize("which", ["test_files", "testbed_files"])
@pytest.mark.parametrize("key", ["../../escaped", "a/../../escaped", "/tmp/escaped-abs", ""])
def test_load_record_refuses_keys_that_leave_their_directory(tmp_path, which, key):
    rec = convert_task(BUNDLED[0])
    rec["metadata"]["harbor"][which] = {key: encode_payload(b"pwned")}
    with pytest.raises(TaskSpecError) as e:
        load_record(json.loads(json.dumps(rec)))
    msg = str(e.value)
    assert f"metadata.harbor.{which}: key {key!r}" in msg and rec["metadata"]["instance_id"] in msg, msg
    assert "convert it again" in msg


def test_load_record_refuses_a_payload_that_inflates_past_the_limit():
    rec = convert_task(BUNDLED[0])
    bomb = base64.b64encode(gzip.compress(b"\0" * (MAX_FILE_BYTES + 1), mtime=0)).decode()
    assert len(bomb) < 100_000
    rec["metadata"]["harbor"]["testbed_files"] = {"bomb.bin": bomb}
    with pytest.raises(TaskSpecError, match="'bomb.bin': the payload inflates to more than"):
        load_record(rec)
    rec["metadata"]["harbor"]["testbed_files"] = {"junk.bin": "bm90IGd6aXA="}
    with pytest.raises(TaskSpecError, match="'junk.bin': the payload is not gzip data"):
        load_record(rec)


def test_load_record_refuses_infinity_and_a_root_workdir_from_json():
    line = render_jsonl([convert_task(BUNDLED[0])]).decode()
    rec = json.loads(line)
    agent_s = rec["metadata"]["timeouts"]["agent_s"]
    rec = json.loads(line.replace(f'"agent_s": {agent_s!r}', '"agent_s": Infinity'))  # json.loads takes it
    assert rec["metadata"]["timeouts"]["agent_s"] == float("inf")
    with pytest.raises(TaskSpecError, match="timeouts.agent_s"):
        load_record(rec)
    rec = json.loads(line)
    rec["metadata"]["workdir"] = "/"
    with pytest.raises(TaskSpecError, match="workdir: must not be the root directory"):
        load_record(rec)


def test_bundled_tasks_still_load_and_materialize(tmp_path):
    for t in BUNDLED:
        task = load_record(json.loads(render_jsonl([convert_task(t)])))
        repo = materialize(task.testbed, tmp_path / t.name)
        assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()) == sorted(task.testbed)


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/etc/agentrl-should-not-exist", "", "a/./b"])
def test_materialize_refuses_keys_outside_its_directory(tmp_path, key):
    into = tmp_path / "deep" / "into"
    with pytest.raises(TaskSpecError) as e:
        materialize({"ok.py": b"1", key: b"pwned"}, into)
    assert repr(key) in str(e.value), str(e.value)
    assert not Path("/etc/agentrl-should-not-exist").exists()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # checked before anything is written


def test_materialize_does_not_write_through_a_symlink_already_there(tmp_path, secret):
    into = tmp_path / "into"
    into.mkdir()
    (into / "link").symlink_to(secret.parent, target_is_directory=True)
    with pytest.raises(TaskSpecError, match="'link/x'.*outside"):
        materialize({"link/x": b"pwned"}, into)
    (into / "f").symlink_to(secret)
    with pytest.raises(TaskSpecError, match="'f'.*is a symlink"):
        materialize({"f": b"pwned"}, into)
    assert secret.read_text() == "TOP SECRET\n" and not (secret.parent / "x").exists()


# --- the CLIs ---------------------------------------------------------------------------------------------------

def test_cli_tasks_check_refuses_a_jsonl_with_traversal_keys(tmp_path, capsys):
    rec = convert_task(BUNDLED[0])
    rec["metadata"]["harbor"]["testbed_files"]["../../../tmp/agentrl-escaped"] = encode_payload(b"pwned")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(render_jsonl([rec]))
    assert main(["tasks", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "cannot load the tasks" in err and "'../../../tmp/agentrl-escaped'" in err and "'..'" in err, err
    assert not Path("/tmp/agentrl-escaped").exists()


def test_cli_convert_harbor_names_the_symlink(tmp_path, secret, capsys):
    t = make_task(tmp_path / "ds")
    (t / "tests" / "test.sh").unlink()
    (t / "tests" / "test.sh").symlink_to(secret)
    out = tmp_path / "p.jsonl"
    assert main(["convert", "harbor", str(t), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{t / 'tests' / 'test.sh'}: is a symlink to {secret}" in err and not out.exists()
