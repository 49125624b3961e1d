"""The SWE task spec, verifier payloads, Harbor's reward rules, and the bundled tasks on the host."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrl.swe.harbor import BUNDLED_TASKS
from agentrl.swe.task import (
    DECODE_COMMAND,
    RewardError,
    TaskSpecError,
    decode_payload,
    encode_payload,
    install_payload_argv,
    load_task_spec,
    reward_from,
)

pytestmark = pytest.mark.integration

HOST_PYTHON = "/usr/bin/python3"  # what a sandbox on the host's root filesystem sees, not the venv
TASK_DIRS = sorted(p for p in BUNDLED_TASKS.iterdir() if (p / "task.toml").exists())


def spec(**over):
    data = {"instance_id": "t1", "image": "host", "workdir": "/testbed", "prompt": "fix it",
            "eval_command": ["bash", "/tests/test.sh"], "timeouts": {"agent_s": 60, "eval_s": 30}}
    return {**data, **over}


def test_a_valid_spec_and_its_defaults():
    s = load_task_spec(spec(eval_command="cd /testbed && python3 -m unittest"))
    assert s.resources.cpus == 1 and s.resources.mem_mb > 0
    assert s.reset_to_base_commit is False and s.files_to_exclude_from_patch == []
    assert s.eval_argv() == ["bash", "-c", "cd /testbed && python3 -m unittest"]
    assert load_task_spec(spec()).eval_argv() == ["bash", "/tests/test.sh"]


@pytest.mark.parametrize("over, field", [
    ({"workdir": "testbed"}, "workdir"),
    ({"timeouts": {"agent_s": 0, "eval_s": 30}}, "timeouts.agent_s"),
    ({"timeouts": {"agent_s": 10, "eval_s": -1}}, "timeouts.eval_s"),
    ({"resources": {"cpus": 0}}, "resources.cpus"),
    ({"image": ""}, "image"),
    ({"eval_command": []}, "eval_command"),
    ({"surprise": 1}, "surprise"),
    ({"reset_to_base_commit": True}, "reset_to_base_commit"),
])
def test_errors_name_the_source_and_the_field(over, field):
    with pytest.raises(TaskSpecError) as e:
        load_task_spec(spec(**over), source="tasks/x/task.toml")
    assert "tasks/x/task.toml" in str(e.value) and field in str(e.value)


def test_a_missing_field_is_named():
    data = spec()
    del data["prompt"]
    with pytest.raises(TaskSpecError, match="prompt"):
        load_task_spec(data)


@pytest.mark.parametrize("code, txt, js, want", [
    (0, None, None, 1.0),
    (3, None, None, 0.0),
    (1, "1\n", None, 1.0),              # the file wins over the exit code
    (0, " 0.25 ", None, 0.25),
    (0, "1", '{"reward": 0.5}', 0.5),   # reward.json wins over reward.txt
    (0, None, '{"reward": 0}', 0.0),
    (0, None, '{"pass_rate": 0.75, "note": "x"}', 0.75),  # a single numeric field is the reward
    (0, "0.4", '{"a": 1, "b": 0}', 0.4),  # no "reward" key: reward.txt gives the scalar, as in Harbor
])
def test_reward_rules(code, txt, js, want):
    assert reward_from(code, txt, js) == want


@pytest.mark.parametrize("txt, js, problem", [
    ("", None, "reward.txt is empty"),
    ("passed", None, "not a number"),
    ("nan", None, "not a finite number"),
    (None, "", "reward.json is empty"),
    (None, "{oops", "not valid JSON"),
    (None, "[1]", "holds a list"),
    (None, '{"reward": "1"}', "reward.json: reward"),
    (None, '{"reward": true}', "not a number"),
    (None, '{"a": 1, "b": 0}', "cannot tell which"),
])
def test_malformed_reward_files_are_errors_not_zero(txt, js, problem):
    with pytest.raises(RewardError, match=problem):
        reward_from(0, txt, js)


def test_payload_of_100k_test_names_goes_through_stdin_of_a_real_bash(tmp_path):
    names = [f"tests/test_module_{i // 100}.py::TestCase{i % 7}::test_case_number_{i}" for i in range(100_000)]
    raw = json.dumps({"FAIL_TO_PASS": names[:10], "PASS_TO_PASS": names}, indent=1).encode().replace(b"\n", b"\r\n")
    assert len(raw) > os.sysconf("SC_ARG_MAX")
    with pytest.raises(OSError):  # what argv or an inline heredoc would have hit (E2BIG)
        subprocess.run(["bash", "-c", f"cat <<'EOF'\n{raw.decode()}\nEOF"], capture_output=True)
    payload = encode_payload(raw)
    assert payload == encode_payload(raw)  # reproducible: gzip without a timestamp
    assert decode_payload(payload) == raw
    r = subprocess.run(["bash", "-c", DECODE_COMMAND], input=payload.encode(), capture_output=True, check=True)
    assert r.stdout == raw
    dest = tmp_path / "dir with space" / "config.json"
    dest.parent.mkdir()
    subprocess.run(install_payload_argv(str(dest)), input=payload.encode(), check=True)
    assert dest.read_bytes() == raw


def _run(script: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not Path(HOST_PYTHON).exists(), reason="needs the host's /usr/bin/python3")
@pytest.mark.parametrize("task", TASK_DIRS, ids=lambda p: p.name)
def test_bundled_task_fails_before_and_passes_after_its_solution(task, tmp_path):
    testbed, logs = tmp_path / "testbed", tmp_path / "logs" / "verifier"
    shutil.copytree(task / "environment" / "repo", testbed, ignore=shutil.ignore_patterns("__pycache__"))
    # The scripts take Harbor's paths from the environment; PATH keeps the venv's python out.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TESTBED": str(testbed),
           "LOGS_DIR": str(logs), "TESTS_DIR": str(task / "tests"), "PYTHON": HOST_PYTHON}

    before = _run(task / "tests" / "test.sh", env)
    assert before.returncode != 0, before.stdout + before.stderr
    assert reward_from(before.returncode, (logs / "reward.txt").read_text(), None) == 0.0
    assert "test_issue" in before.stderr and "FAIL" in before.stderr

    solved = _run(task / "solution" / "solve.sh", env)
    assert solved.returncode == 0, solved.stderr

    after = _run(task / "tests" / "test.sh", env)
    assert after.returncode == 0, after.stdout + after.stderr
    assert reward_from(after.returncode, (logs / "reward.txt").read_text(), None) == 1.0


def test_there_are_at_least_eight_bundled_tasks_with_every_harbor_file():
    assert len(TASK_DIRS) >= 8
    for t in TASK_DIRS:
        for rel in ("instruction.md", "task.toml", "tests/test.sh", "tests/test_issue.py", "solution/solve.sh"):
            assert (t / rel).is_file(), t / rel
        assert not any("pytest" in p.read_text() for p in (t / "environment" / "repo").rglob("*.py"))
