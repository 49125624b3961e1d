"""Harbor task directories -> JSONL: exact bytes, reproducible output, malformed tasks, atomic output, CLI."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.swe.harbor import (
    BUNDLED_TASKS,
    EVAL_COMMAND,
    HarborTaskError,
    convert_task,
    convert_tasks,
    write_prompts,
)
from agentrl.swe.task import decode_payload, load_task_spec

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = sorted(p for p in BUNDLED_TASKS.iterdir() if (p / "task.toml").exists())

TOML = b"""schema_version = "1.1"
[agent]
timeout_sec = 300.0
[verifier]
timeout_sec = 90
[environment]
docker_image = "swebench/sweb.eval.x86_64.demo:latest"
workdir = "/testbed"
cpus = 2
memory = "4G"
[metadata]
base_commit = "abc123"
"""


def make_task(root: Path, name: str = "demo__demo-1", *, toml: bytes = TOML,
              instruction: bytes = b"Fix the bug.\r\n\r\nDetails\xe2\x80\xa8here.\n",
              config: bytes | None = None, dockerfile: bytes | None = None) -> Path:
    t = root / name
    (t / "environment").mkdir(parents=True)
    (t / "tests").mkdir()
    (t / "solution").mkdir()
    (t / "instruction.md").write_bytes(instruction)
    (t / "task.toml").write_bytes(toml)
    (t / "tests" / "test.sh").write_bytes(b"#!/bin/bash\r\necho 1 > /logs/verifier/reward.txt\n")
    (t / "tests" / "fixture.bin").write_bytes(b"\x00\xff binary")
    (t / "solution" / "solve.sh").write_bytes(b"#!/bin/bash\ntrue\n")
    if config is not None:
        (t / "tests" / "config.json").write_bytes(config)
    if dockerfile is not None:
        (t / "environment" / "Dockerfile").write_bytes(dockerfile)
    return t


def test_bundled_tasks_convert_with_the_prompt_byte_for_byte(tmp_path):
    result = convert_tasks([BUNDLED_TASKS])
    assert not result.errors
    assert [r["metadata"]["instance_id"] for r in result.records] == [p.name for p in BUNDLED]
    for rec, task in zip(result.records, BUNDLED, strict=True):
        md = rec["metadata"]
        assert rec["prompt"].encode() == (task / "instruction.md").read_bytes() == md["problem_statement"].encode()
        assert (md["image"], md["workdir"], md["eval_command"]) == ("host", "/testbed", EVAL_COMMAND)
        assert md["timeouts"] == {"agent_s": 900.0, "eval_s": 120.0}
        assert md["harbor"]["config_json"] is None
        assert md["harbor"]["test_sh"].encode() == (task / "tests" / "test.sh").read_bytes()
        repo = task / "environment" / "repo"
        want = {p.relative_to(repo).as_posix(): p.read_bytes() for p in repo.rglob("*.py")}
        assert {k: decode_payload(v) for k, v in md["harbor"]["testbed_files"].items()} == want
        hidden = md["harbor"]["test_files"]["test_issue.py"]
        assert decode_payload(hidden) == (task / "tests/test_issue.py").read_bytes()
        # metadata is a TaskSpec (plus problem_statement and harbor), so a consumer can validate it
        spec = {k: v for k, v in md.items() if k not in ("problem_statement", "harbor")}
        assert load_task_spec({**spec, "prompt": rec["prompt"]}).instance_id == task.name


def test_crlf_config_json_and_instruction_are_kept_byte_for_byte(tmp_path):
    config = b'{\r\n  "FAIL_TO_PASS": ["t::a"],\r\n  "PASS_TO_PASS": ["t::b \xc3\xa9"]\r\n}\r\n'
    t = make_task(tmp_path, config=config)
    out = tmp_path / "out.jsonl"
    write_prompts([t], out)
    (line,) = out.read_bytes().splitlines()
    rec = json.loads(line)
    assert rec["metadata"]["harbor"]["config_json"].encode() == config
    assert rec["prompt"].encode() == (t / "instruction.md").read_bytes()
    assert rec["metadata"]["harbor"]["test_sh"].encode() == (t / "tests" / "test.sh").read_bytes()
    assert decode_payload(rec["metadata"]["harbor"]["test_files"]["fixture.bin"]) == b"\x00\xff binary"
    assert rec["metadata"]["harbor"]["testbed_files"] is None  # an image brings its own repository
    md = rec["metadata"]
    assert md["resources"] == {"cpus": 2, "mem_mb": 4096, "storage_mb": None, "pids": 1024}  # memory = "4G"
    assert (md["base_commit"], md["reset_to_base_commit"]) == ("abc123", False)
    assert md["timeouts"] == {"agent_s": 300.0, "eval_s": 90.0}


def test_output_is_reproducible(tmp_path):
    make_task(tmp_path / "ds", "b-task", config=b"{}")
    make_task(tmp_path / "ds", "a-task")
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_prompts([BUNDLED_TASKS, tmp_path / "ds"], a)
    write_prompts(list(reversed([BUNDLED_TASKS, tmp_path / "ds"])), b)
    assert a.read_bytes() == b.read_bytes()
    ids = [json.loads(x)["metadata"]["instance_id"] for x in a.read_bytes().splitlines()]
    assert ids == sorted(ids) and len(ids) == len(BUNDLED) + 2


def test_image_and_workdir_from_a_plain_dockerfile(tmp_path):
    toml = b"[agent]\ntimeout_sec = 60\n"
    df = b"# prebuilt\nFROM --platform=linux/amd64 swebench/sweb.eval.x86_64.x:latest\nWORKDIR /testbed\n"
    md = convert_task(make_task(tmp_path, toml=toml, dockerfile=df))["metadata"]
    assert (md["image"], md["workdir"], md["timeouts"]["eval_s"]) == (
        "swebench/sweb.eval.x86_64.x:latest", "/testbed", 600.0)  # Harbor's verifier default


SWEBENCH_DOCKERFILE = (b"FROM swebench/sweb.eval.x86_64.django__django-11099:latest\nWORKDIR /testbed\n"
                       b"RUN curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\nRUN mkdir -p /logs\n")


def test_the_swebench_template_converts_to_an_image_built_from_its_content(tmp_path):
    toml = b"[agent]\ntimeout_sec = 60\n"
    a = convert_task(make_task(tmp_path, "a", toml=toml, dockerfile=SWEBENCH_DOCKERFILE))["metadata"]
    b = convert_task(make_task(tmp_path, "b", toml=toml, dockerfile=SWEBENCH_DOCKERFILE))["metadata"]
    build = a["harbor"]["environment_build"]
    assert a["image"] == "dockerfile:" + build["key"] and a["workdir"] == "/testbed"
    assert set(build["files"]) == {"Dockerfile"} and build["executable"] == []
    assert b["image"] == a["image"]      # one environment, one build, whatever the task's name
    c_dir = make_task(tmp_path, "c", toml=toml, dockerfile=SWEBENCH_DOCKERFILE)
    (c_dir / "environment" / "setup.sh").write_bytes(b"echo\n")
    c = convert_task(c_dir)["metadata"]
    assert c["image"] != a["image"]      # the context is part of the build's content
    (c_dir / "environment" / "setup.sh").chmod(0o755)
    c_exec = convert_task(c_dir)["metadata"]
    assert c_exec["harbor"]["environment_build"]["executable"] == ["setup.sh"] and c_exec["image"] != c["image"]
    pre = convert_task(make_task(tmp_path, "d", toml=toml + b"[environment]\ndocker_image = 'x/y:1'\n",
                                 dockerfile=SWEBENCH_DOCKERFILE))["metadata"]
    assert pre["image"] == "x/y:1" and pre["harbor"]["environment_build"] is None   # prebuilt: as Harbor does


def _bad(tmp_path: Path, what: str) -> tuple[Path, Path]:
    """A malformed task and the path its error must name."""
    if what == "missing instruction.md":
        t = make_task(tmp_path, what.replace(" ", "_"))
        (t / "instruction.md").unlink()
        return t, t / "instruction.md"
    if what == "bad TOML":
        t = make_task(tmp_path, "bad_toml", toml=b"[agent\ntimeout_sec = 1\n")
        return t, t / "task.toml"
    if what == "no image":
        t = make_task(tmp_path, "no_image", toml=b"[agent]\ntimeout_sec = 60\n[environment]\nworkdir = '/w'\n")
        return t, t / "task.toml"
    if what == "dockerfile copies what its context lacks":
        t = make_task(tmp_path, "build", toml=b"[agent]\ntimeout_sec = 60\n",
                      dockerfile=b"FROM python:3.11\nCOPY req.txt /app/\nWORKDIR /app\n")
        return t, t / "environment" / "Dockerfile"
    if what == "no agent timeout":
        t = make_task(tmp_path, "no_timeout", toml=TOML.replace(b"timeout_sec = 300.0", b""))
        return t, t / "task.toml"
    if what == "missing test.sh":
        t = make_task(tmp_path, "no_test_sh")
        (t / "tests" / "test.sh").unlink()
        return t, t / "tests" / "test.sh"
    if what == "host task without its repo":
        t = make_task(tmp_path, "host_no_repo", toml=TOML.replace(b"swebench/sweb.eval.x86_64.demo:latest", b"host"))
        return t, t / "environment" / "repo"
    if what == "not utf-8":
        t = make_task(tmp_path, "latin1", instruction=b"caf\xe9\n")
        return t, t / "instruction.md"
    raise AssertionError(what)


BAD = ["missing instruction.md", "bad TOML", "no image", "dockerfile copies what its context lacks", "no agent timeout",
       "missing test.sh", "not utf-8", "host task without its repo"]


@pytest.mark.parametrize("what", BAD)
def test_a_malformed_task_is_reported_by_path(tmp_path, what):
    task, named = _bad(tmp_path, what)
    with pytest.raises(HarborTaskError) as e:
        convert_task(task)
    assert str(e.value).startswith(str(named)), str(e.value)
    if what == "no agent timeout":
        assert "[agent] timeout_sec" in str(e.value)


def test_on_error_skip_writes_the_good_tasks_and_fail_writes_nothing(tmp_path):
    good = make_task(tmp_path, "good")
    bad, named = _bad(tmp_path, "bad TOML")
    out = tmp_path / "out.jsonl"

    result = write_prompts([good, bad], out, on_error="fail")
    assert [e.path for e in result.errors] == [named] and not out.exists()
    assert not list(tmp_path.glob(".out.jsonl.tmp*"))

    out.write_bytes(b"old\n")  # a failed run leaves an earlier output as it was, never half-written
    write_prompts([good, bad], out, on_error="fail")
    assert out.read_bytes() == b"old\n"

    result = write_prompts([good, bad], out, on_error="skip")
    assert len(result.errors) == 1
    (line,) = out.read_bytes().splitlines()
    assert json.loads(line)["metadata"]["instance_id"] == "good"


def test_duplicate_instance_ids_are_errors(tmp_path):
    a = make_task(tmp_path / "one", "same")
    b = make_task(tmp_path / "two", "same")
    result = convert_tasks([a, b])
    assert len(result.records) == 1 and "also the name of" in str(result.errors[0])


def test_cli_convert_harbor(tmp_path, capsys):
    out = tmp_path / "prompts.jsonl"
    assert main(["convert", "harbor", str(BUNDLED_TASKS), "--out", str(out)]) == 0
    assert len(out.read_bytes().splitlines()) == len(BUNDLED)

    bad, named = _bad(tmp_path, "no image")
    out2 = tmp_path / "fail.jsonl"
    assert main(["convert", "harbor", str(BUNDLED[0]), str(bad), "--out", str(out2)]) == 1
    assert str(named) in capsys.readouterr().err and not out2.exists()
    assert main(["convert", "harbor", str(BUNDLED[0]), str(bad), "--out", str(out2), "--on-error", "skip"]) == 0
    assert "skipped" in capsys.readouterr().err and len(out2.read_bytes().splitlines()) == 1

    with pytest.raises(SystemExit) as e:
        main(["convert", "harbor", "--help"])
    assert e.value.code == 0 and "--on-error" in capsys.readouterr().out


@pytest.mark.integration
def test_tool_script_gives_the_same_bytes_as_the_cli(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["convert", "harbor", str(BUNDLED_TASKS), "--out", str(a)]) == 0
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "harbor_to_prompts.py"), str(BUNDLED_TASKS),
                        "--out", str(b)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert a.read_bytes() == b.read_bytes()


def test_a_copied_bundled_task_converts_from_anywhere(tmp_path):
    t = shutil.copytree(BUNDLED[0], tmp_path / BUNDLED[0].name)
    assert convert_task(t) == convert_task(BUNDLED[0])


def test_a_testbed_rides_in_the_record_and_tasks_of_one_environment_share_its_build(tmp_path):
    """[environment] testbed: the repository is carried as a host task's is, and left out of the build
    context, so tasks whose repositories differ (a project's bugs) share one build of its dependencies."""
    toml = b"[agent]\ntimeout_sec = 60\n[environment]\ntestbed = 'repo'\n"
    dockerfile = b"FROM python:3.11-slim\nWORKDIR /testbed\nCOPY wheels/ /opt/wheels/\nRUN pip install /opt/wheels/*\n"
    made = []
    for name, code in (("a", b"x = 1\n"), ("b", b"x = 2\n")):
        t = make_task(tmp_path, name, toml=toml, dockerfile=dockerfile)
        (t / "environment" / "repo" / "pkg").mkdir(parents=True)
        (t / "environment" / "repo" / "pkg" / "mod.py").write_bytes(code)
        (t / "environment" / "wheels").mkdir()
        (t / "environment" / "wheels" / "dep-1.0-py3-none-any.whl").write_bytes(b"PK wheel")
        made.append(convert_task(t)["metadata"])
    a, b = made
    assert a["image"] == b["image"] == "dockerfile:" + a["harbor"]["environment_build"]["key"]
    assert set(a["harbor"]["environment_build"]["files"]) == {"Dockerfile", "wheels/dep-1.0-py3-none-any.whl"}
    assert {k: decode_payload(v) for k, v in b["harbor"]["testbed_files"].items()} == {"pkg/mod.py": b"x = 2\n"}
    without = make_task(tmp_path, "c", toml=b"[agent]\ntimeout_sec = 60\n", dockerfile=dockerfile)
    shutil.copytree(tmp_path / "a" / "environment", without / "environment", dirs_exist_ok=True)
    plain = convert_task(without)["metadata"]          # no key: Harbor's rule, the whole directory is the context
    assert plain["harbor"]["testbed_files"] is None and plain["image"] != a["image"]
    # The testbed is not in the context, so a Dockerfile that copies it is refused at conversion
    copies = make_task(tmp_path, "d", toml=toml)
    shutil.copytree(tmp_path / "a" / "environment", copies / "environment", dirs_exist_ok=True)
    (copies / "environment" / "Dockerfile").write_bytes(dockerfile + b"COPY repo/ /testbed/\n")
    with pytest.raises(HarborTaskError, match=r"'repo/' is not in the build context.*testbed.*put at workdir"):
        convert_task(copies)
    missing = make_task(tmp_path, "e", toml=toml, dockerfile=b"FROM python:3.11-slim\nWORKDIR /testbed\nRUN true\n")
    with pytest.raises(HarborTaskError, match="testbed names it"):
        convert_task(missing)


@pytest.mark.parametrize("testbed", ["'/abs'", "'../up'", "''", "3", "'a/../b'"])
def test_a_bad_testbed_names_the_key(tmp_path, testbed):
    t = make_task(tmp_path, toml=TOML.replace(b'workdir = "/testbed"', b'workdir = "/testbed"\ntestbed = '
                                              + testbed.encode()))
    with pytest.raises(HarborTaskError, match=r"task.toml: \[environment\] testbed must name a directory"):
        convert_task(t)


@pytest.mark.parametrize("toml, key", [
    (TOML.replace(b"cpus = 2", b"cpus = 0"), "[environment] cpus"),
    (TOML.replace(b'memory = "4G"', b'memory_mb = "lots"'), "[environment] memory_mb"),
    (TOML.replace(b'workdir = "/testbed"', b'workdir = "testbed"'), "[environment] workdir"),
    (TOML.replace(b"timeout_sec = 90", b"timeout_sec = -1"), "[verifier] timeout_sec"),
    (TOML.replace(b'base_commit = "abc123"', b"reset_to_base_commit = true"), "[metadata] reset_to_base_commit"),
])
def test_bad_values_name_the_toml_key(tmp_path, toml, key):
    t = make_task(tmp_path, toml=toml)
    with pytest.raises(HarborTaskError) as e:
        convert_task(t)
    assert str(e.value).startswith(f"{t / 'task.toml'}: {key}"), str(e.value)


def test_reset_and_exclusions_are_opt_in_metadata_keys(tmp_path):
    toml = TOML + b'reset_to_base_commit = true\nfiles_to_exclude_from_patch = ["*.orig", ".scratch/*"]\n'
    md = convert_task(make_task(tmp_path, toml=toml))["metadata"]
    assert (md["reset_to_base_commit"], md["files_to_exclude_from_patch"]) == (True, ["*.orig", ".scratch/*"])


def test_an_empty_instruction_names_instruction_md(tmp_path):
    t = make_task(tmp_path, instruction=b"")
    with pytest.raises(HarborTaskError, match="instruction.md"):
        convert_task(t)


@pytest.mark.parametrize("env, storage", [('storage_mb = 5120', 5120), ('storage = "10G"', 10240), ('', None)])
def test_storage_from_harbor_names(tmp_path, env, storage):
    from agentrl.swe.harbor import parse_task_toml
    text = f'[agent]\ntimeout_sec = 10.0\n[environment]\ndocker_image = "host"\nworkdir = "/testbed"\n{env}\n'
    assert parse_task_toml(text, tmp_path, tmp_path / "task.toml")["resources"]["storage_mb"] == storage


def test_a_bad_storage_size_names_the_key(tmp_path):
    from agentrl.swe.harbor import HarborTaskError, parse_task_toml
    text = '[agent]\ntimeout_sec = 10.0\n[environment]\ndocker_image = "host"\nworkdir = "/testbed"\nstorage = "lots"\n'
    with pytest.raises(HarborTaskError, match="storage 'lots' is not a size"):
        parse_task_toml(text, tmp_path, tmp_path / "task.toml")


def test_a_datasets_hidden_directories_are_not_tasks(tmp_path):
    from agentrl.swe.harbor import expand_task_dirs
    for name in ("a", ".a.tmp-123", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "instruction.md").write_text("x")
    assert expand_task_dirs([tmp_path]) == [tmp_path / "a", tmp_path / "b"]
