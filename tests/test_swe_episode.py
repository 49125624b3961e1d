"""A task's life in a real bwrap sandbox: baseline, the agent's change, its patch, the grade."""

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.swe import episode
from agentrl.swe.harbor import BUNDLED_TASKS, convert_task
from agentrl.swe.loaded import load_record, load_tasks
from hpc.sandbox.base import SandboxSpec
from hpc.sandbox.bwrap import BwrapSandbox

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                reason="needs bubblewrap (make sysdeps) and root for overlay mounts")]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 180))


@pytest.fixture
def roman():
    return load_record(convert_task(BUNDLED_TASKS / "roman-subtractive"))


def test_patch_holds_the_agents_change_and_grades_in_a_fresh_sandbox(roman, tmp_path):
    spec = roman.spec.model_copy(update={"files_to_exclude_from_patch": ["*.log"]})
    repo = BUNDLED_TASKS / "roman-subtractive/environment/repo"

    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            await episode.baseline(sb, spec)
            await sb.write_file("/solution/solve.sh", roman.solution, mode=0o755)
            agent = await episode.run_agent(sb, spec, "bash /solution/solve.sh && printf '\\x00\\x01bin' > data.bin "
                                                      "&& echo scratch > notes.log && git init -q 2>/dev/null; true")
            diff = await episode.patch(sb, spec)
            same = await episode.grade(sb, spec, roman.tests)
        # Isolated grading: the patch alone, applied to an untouched copy, must earn the same reward.
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as fresh:
            await episode.apply_patch(fresh, spec, diff)
            isolated = await episode.grade(fresh, spec, roman.tests)
        return agent, diff, same, isolated
    agent, diff, same, isolated = run(go())
    assert agent.exit_code == 0, agent.stderr
    assert b'(9, "IX")' in diff and b"GIT binary patch" in diff and b"data.bin" in diff
    assert b"notes.log" not in diff                       # excluded scratch file
    assert b".git" not in diff                            # the agent's own git dir is no change of the task
    assert (same.reward, isolated.reward) == (1.0, 1.0)


def test_agent_time_limit_stops_its_process_group_before_grading(roman):
    spec = roman.spec.model_copy(update={"timeouts": roman.spec.timeouts.model_copy(update={"agent_s": 1.0})})
    repo = BUNDLED_TASKS / "roman-subtractive/environment/repo"

    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            await episode.baseline(sb, spec)
            r = await episode.run_agent(sb, spec, "(while true; do echo x >> busy.txt; sleep 0.1; done) & wait")
            size = (await sb.exec("wc -c < busy.txt")).stdout
            await asyncio.sleep(0.5)
            later = (await sb.exec("wc -c < busy.txt")).stdout
            g = await episode.grade(sb, spec, roman.tests)
        return r, size, later, g
    r, size, later, g = run(go())
    assert r.timed_out and size == later          # nothing of the agent runs on after its time
    assert g.reward == 0.0 and not g.timed_out


def test_the_verifier_files_enter_only_at_grading(roman):
    repo = BUNDLED_TASKS / "roman-subtractive/environment/repo"

    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            await episode.baseline(sb, roman.spec)
            before = await episode.run_agent(sb, roman.spec, "ls /tests /logs 2>&1; cat /var/lib/agentrl/x 2>&1")
            await episode.grade(sb, roman.spec, roman.tests)
            after = await sb.exec("ls /tests", user="root")
        return before, after
    before, after = run(go())
    assert b"No such file" in before.stdout and b"Permission denied" in before.stdout
    assert b"test.sh" in after.stdout


def test_tasks_check_of_the_bundled_tasks_and_a_broken_one(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(BUNDLED_TASKS / "roman-subtractive", broken)
    (broken / "solution/solve.sh").write_text("#!/usr/bin/env bash\ntrue\n")   # "fixes" nothing
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "check", str(BUNDLED_TASKS), str(broken),
                        "--json", "--concurrency", "2"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 1, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    rows = {t["instance_id"]: t for t in result["tasks"]}
    assert len(rows) == 9 and result["flagged"] == 1
    assert "the solution does not pass" in rows["broken"]["problem"]
    for name in os.listdir(BUNDLED_TASKS):
        assert (rows[name]["oracle_reward"], rows[name]["noop_reward"], rows[name]["problem"]) == (1.0, 0.0, "")


def test_load_tasks_from_jsonl_equals_from_directories(tmp_path):
    out = tmp_path / "prompts.jsonl"
    subprocess.run([sys.executable, "-m", "agentrl.cli", "convert", "harbor", str(BUNDLED_TASKS), "--out", str(out)],
                   check=True, capture_output=True, cwd=ROOT)
    assert load_tasks([str(out)]) == load_tasks([str(BUNDLED_TASKS)])


def test_grading_a_task_whose_config_json_holds_100000_test_names(tmp_path):
    task = tmp_path / "big"
    shutil.copytree(BUNDLED_TASKS / "roman-subtractive", task)
    names = [f"tests/test_mod_{i}.py::TestCase::test_{i}" for i in range(100_000)]
    config = json.dumps({"PASS_TO_PASS": names, "FAIL_TO_PASS": ["tests/test_issue.py"]}).encode()
    assert len(config) > 2 * 1024 * 1024   # past ARG_MAX (2 MiB) and far past one argument's 128 KiB
    (task / "tests/config.json").write_bytes(config)
    test_sh = (task / "tests/test.sh").read_text().replace(
        'mkdir -p "$LOGS_DIR"',
        'mkdir -p "$LOGS_DIR"\n'
        'n=$("$PYTHON" -c \'import json,sys; print(len(json.load(open(sys.argv[1]))["PASS_TO_PASS"]))\' '
        '"$TESTS_DIR"/config.json)\n'
        '[ "$n" = 100000 ] || { echo "config.json has $n names" >&2; echo 0 > "$LOGS_DIR"/reward.txt; exit 3; }')
    (task / "tests/test.sh").write_text(test_sh)
    loaded = load_record(convert_task(task))
    assert loaded.tests["config.json"] == config

    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(task / "environment/repo"))) as sb:
            await episode.baseline(sb, loaded.spec)
            await sb.write_file("/solution/solve.sh", loaded.solution, mode=0o755)
            await episode.run_agent(sb, loaded.spec, ["bash", "/solution/solve.sh"])
            return await episode.grade(sb, loaded.spec, loaded.tests)
    g = run(go())
    assert g.reward == 1.0, g.output[-2000:]


def test_bytecode_never_travels_in_a_patch_nor_survives_a_restore(roman, tmp_path):
    # The task ships a pyc (in the baseline); the agent rewrites it as an unchecked-hash pyc (PEP 552: never
    # compared with its source), plants others, a __pycache__ of other files and a __pycache__ symlink to /tmp,
    # and changes a source file and binary files. Bytecode is code the grader would run that the patch's
    # sources do not show: none of it reaches either grading, while every other change does.
    repo = tmp_path / "repo"
    shutil.copytree(BUNDLED_TASKS / "roman-subtractive/environment/repo", repo)
    (repo / "roman/__pycache__").mkdir()
    shipped = b"\x00shipped pyc"
    (repo / "roman/__pycache__/convert.cpython-311.pyc").write_bytes(shipped)
    (repo / "blob.bin").write_bytes(b"\x00\x01old")
    agent = ("python3 -c 'import py_compile as p; p.compile(\"roman/convert.py\", cfile=\"roman/__pycache__/"
             "convert.cpython-311.pyc\", invalidation_mode=p.PycInvalidationMode.UNCHECKED_HASH)' && "
             "printf '\\x00pyc' > stray.pyc && printf '\\x00pyo' > roman/old.pyo && "
             "mkdir -p __pycache__ /tmp/elsewhere && echo x > __pycache__/notes.txt && "
             "ln -s /tmp/elsewhere tests/__pycache__ && printf '\\x00\\x01new' > blob.bin && "
             "printf '\\x00\\x02' > data.bin && echo '# changed' >> roman/convert.py")

    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            await episode.baseline(sb, roman.spec, restorable=True)
            r = await episode.run_agent(sb, roman.spec, ["bash", "-c", agent])
            assert r.exit_code == 0, r.stderr
            w = roman.spec.workdir
            planted = (await sb.read_file(f"{w}/roman/__pycache__/convert.cpython-311.pyc"))[4:8]
            diff = await episode.patch(sb, roman.spec)
            await episode.restore(sb, roman.spec, diff)
            left = (await sb.exec(["find", ".", "-name", "*.py[co]", "-o", "-name", "__pycache__"], cwd=w)).stdout
            return (planted, diff, left, await sb.read_file(f"{w}/roman/__pycache__/convert.cpython-311.pyc"),
                    await sb.read_file(f"{w}/data.bin"))
    planted, diff, left, pyc, data = run(go())
    assert planted == b"\x01\x00\x00\x00"          # the agent's pyc was an unchecked-hash one
    assert b"# changed" in diff and b"GIT binary patch" in diff and b"blob.bin" in diff and b"data.bin" in diff
    assert b"__pycache__" not in diff and b".pyc" not in diff and b".pyo" not in diff
    # Same-sandbox grading's restore: what the agent added is gone, the shipped pyc is the task's again.
    assert sorted(left.split()) == [b"./roman/__pycache__", b"./roman/__pycache__/convert.cpython-311.pyc"]
    assert (pyc, data) == (shipped, b"\x00\x02")


def test_same_sandbox_grading_moves_to_a_fresh_sandbox_when_the_agent_left_its_own_unusable(roman):
    """The agent's junk holds its sandbox's memory (a tmpfs disk, the fallback): the verifier would
    be killed there, so the patch is graded in a fresh sandbox, as isolated grading does."""
    from hpc.sandbox.policy import Limits
    repo = BUNDLED_TASKS / "roman-subtractive/environment/repo"
    fresh_ones = []

    def fresh():
        fresh_ones.append(BwrapSandbox(SandboxSpec(workdir_source=str(repo))))
        return fresh_ones[-1]

    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo), storage="tmpfs",
                                            limits=Limits(memory_mb=256, storage_mb=1024))) as sb:
            await episode.baseline(sb, roman.spec, restorable=True)
            await sb.write_file("/solution/solve.sh", roman.solution, mode=0o755)
            await episode.run_agent(sb, roman.spec, "bash /solution/solve.sh")
            usable = await episode.unusable(sb)
            diff = await episode.patch(sb, roman.spec)      # (once the memory is held, even git is killed)
            await episode.run_agent(sb, roman.spec, "head -c 640M /dev/zero > /home/agent/junk")
            why = await episode.unusable(sb)
            return usable, why, await episode.grade_attempt(roman, roman.spec, sb, diff, "same", fresh)
    usable, why, grade = run(go())
    assert usable is None and why == "it is at its memory limit"
    assert len(fresh_ones) == 1 and grade.reward == 1.0, grade.output[-500:]


def test_a_patch_too_big_for_its_grading_sandbox_grades_0_naming_the_limit_and_is_no_retry(roman):
    """What the patch brings to grading is hostile: a 40 MiB blob against a grading sandbox of 24 MiB makes
    applying it fail with ENOSPC. That is the patch's doing (reward 0, storage named), not the grader's."""
    from hpc.sandbox.policy import Limits
    repo = BUNDLED_TASKS / "roman-subtractive/environment/repo"

    async def go():
        async with BwrapSandbox(SandboxSpec(workdir_source=str(repo))) as sb:
            await episode.baseline(sb, roman.spec)
            await episode.run_agent(sb, roman.spec, "head -c 40M /dev/urandom > blob.bin")
            diff = await episode.patch(sb, roman.spec)
            small = SandboxSpec(workdir_source=str(repo), limits=Limits(storage_mb=24))
            return await episode.grade_attempt(roman, roman.spec, sb, diff, "isolated", lambda: BwrapSandbox(small))
    grade = run(go())
    assert grade.reward == 0.0 and grade.limits == ("storage",), grade.output[-500:]
    assert b"grading ran into the sandbox's storage limit" in grade.output
