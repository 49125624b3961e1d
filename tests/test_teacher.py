"""The pyfix-hint family and its scripted teacher: demonstrations recorded through the real loop.

Pure: every hint is one literal sed that turns the buggy file into the fixed one; the teacher's
turns and its mistakes. Real: `agentrl eval` with `engine: teacher` runs the builtin agent in bwrap
sandboxes against the teacher through the adapter, grades each attempt with the task's tests, and
saves token-exact samples that `agentrl sft` reads; the right plan passes, each mistake fails.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.eval.score import attempt_seed
from agentrl.swe import generate as gen
from agentrl.swe.families import pyfix_hint
from agentrl.swe.mutate.issue import patch_hint
from agentrl.swe.teacher import (
    FIX,
    FIX_PATCH,
    MINI_SUBMIT,
    MINI_TEXT_BLOCK,
    MISTAKES,
    PROTOCOLS,
    READ,
    Teacher,
    plan,
    protocol,
)
from agentrl.train.sft import load_samples

pytestmark = pytest.mark.integration

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model
ROOT = Path(__file__).resolve().parents[1]
PROTOCOLS_ASKED = list(PROTOCOLS)       # tool calls, mini's tool calls, mini's text, OpenHands': in that order below


def test_every_hint_is_a_literal_sed_that_makes_the_fix(tmp_path):
    for _, d in gen.drafts("pyfix-hint", "train", 3, 40):
        hint = pyfix_hint.hint_of(d)
        assert hint is not None and d.instruction.endswith(
            pyfix_hint.HINT.format(line=hint.line, path=hint.path, bad=hint.bad, good=hint.good, sed=hint.sed()))
        (tmp_path / hint.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / hint.path).write_bytes(d.repo[hint.path])
        subprocess.run(["sh", "-c", hint.sed()], cwd=tmp_path, check=True)
        assert (tmp_path / hint.path).read_bytes() == d.fixed[hint.path], d.instruction


def test_a_draw_without_a_one_line_bug_is_drawn_again_from_the_same_stream():
    kinds = {d.metadata["bug_kind"] for _, d in gen.drafts("pyfix-hint", "heldout", 0, 60)}
    assert "edge-case" not in kinds and len(kinds) >= 3      # edge-case bugs delete lines: never a hint
    assert [d.key for _, d in gen.drafts("pyfix-hint", "train", 1, 5)] == \
           [d.key for _, d in gen.drafts("pyfix-hint", "train", 1, 5)]


def test_the_teacher_is_right_at_its_accuracy_and_consistent_across_turns():
    teacher = Teacher(0.3, seed=4)
    picks = [teacher.mistake(s) for s in range(4000)]
    assert abs(picks.count(None) / 4000 - 0.3) < 0.03
    assert {m for m in picks if m} == set(MISTAKES)
    prompt = "<|im_start|>user\nRead PROBLEM_STATEMENT.md<|im_end|>\n<|im_start|>assistant\n"
    for seed in range(20):
        turns = plan(teacher.mistake(seed))
        assert teacher.reply(prompt, seed) == turns[0]
        assert teacher.reply(prompt + "x<|im_end|>\n<|im_start|>assistant\n", seed) == turns[1]
    with pytest.raises(ValueError, match="accuracy"):
        Teacher(1.5)


def test_only_the_right_plan_runs_the_fix():
    commands = {m: [t["tool_calls"][0]["function"]["arguments"]["command"] for t in plan(m) if "tool_calls" in t]
                for m in (None, *MISTAKES)}
    assert commands[None][:2] == [READ, FIX]
    assert all(FIX not in c for m in MISTAKES for c in commands[m])


def test_a_statement_with_a_patch_gets_the_patch_plan_and_its_command_applies_that_patch(tmp_path):
    teacher = Teacher(1.0)
    start = "<|im_start|>user\nRead PROBLEM_STATEMENT.md<|im_end|>\n<|im_start|>assistant\n"
    patch = b"--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-X = 1\n+X = 2\n"
    statement = f"A test fails:\n\n```\ntrace\n```\n\n{patch_hint(('x.py',), patch)}\n\nfix the code\n"
    read = start + f"x<|im_end|>\n<|im_start|>user\n{statement}<|im_end|>\n<|im_start|>assistant\n"
    command = teacher.reply(read, 0)["tool_calls"][0]["function"]["arguments"]["command"]
    assert command == FIX_PATCH and teacher.reply(start, 0) == plan(None)[0]      # READ first, either way
    assert teacher.reply(read.replace("```diff", "```"), 0) == plan(None)[1]       # no patch: the sed plan
    (tmp_path / "PROBLEM_STATEMENT.md").write_text(statement)
    (tmp_path / "x.py").write_text("X = 1\n")
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True)
    assert (tmp_path / "x.py").read_text() == "X = 2\n"
    dry = plan("dry-run", "tool", FIX_PATCH)[1]["tool_calls"][0]["function"]["arguments"]["command"]
    assert subprocess.run(["bash", "-c", dry], cwd=tmp_path, capture_output=True).stdout == patch


def test_the_teacher_answers_in_the_protocol_its_prompt_asks_for():
    """mini-swe-agent's prompts ask for one action a reply and end a session only at its submit command."""
    mini = f"<|im_start|>user\nRead PROBLEM_STATEMENT.md, then `echo {MINI_SUBMIT}`<|im_end|>\n"
    text = f"<|im_start|>system\nOne block:\n```{MINI_TEXT_BLOCK}\ncmd\n```<|im_end|>\n" + mini
    openhands = '<tools>\n{"type": "function", "function": {"name": "terminal", "description": "Run"}}\n</tools>'
    assert [protocol(p) for p in ("<|im_start|>user\nRead PROBLEM_STATEMENT.md", mini, text, openhands)] \
        == PROTOCOLS_ASKED
    for mistake in (None, *MISTAKES):
        tool, calls, texts, terminal = (plan(mistake, p) for p in ("tool", "mini", "mini_text", "terminal"))
        assert [t.get("tool_calls", [{"function": {"name": "bash"}}])[0]["function"]["name"] for t in tool] \
            == ["bash"] * len(tool)
        assert [{**t, "tool_calls": [{"function": {**c["function"], "name": "bash"}} for c in t["tool_calls"]]}
                if "tool_calls" in t else t for t in terminal] == [
            {**t, "tool_calls": [{"function": c["function"]} for c in t["tool_calls"]]} if "tool_calls" in t else t
            for t in tool]                                            # the same turns, the tool named terminal
        assert {c["function"]["name"] for t in terminal for c in t.get("tool_calls", [])} == {"terminal"}
        commands = [t["tool_calls"][0]["function"]["arguments"]["command"] for t in tool if "tool_calls" in t]
        assert "tool_calls" not in tool[-1]                                   # the builtin agent stops on a text
        assert [t["tool_calls"][0]["function"]["arguments"]["command"] for t in calls] == [
            *commands, f"echo {MINI_SUBMIT}"]                                 # every mini reply is one action
        blocks = [re.findall(rf"```{MINI_TEXT_BLOCK}\n(.*?)\n```", t["content"], re.DOTALL) for t in texts]
        assert blocks == [[c] for c in (*commands, f"echo {MINI_SUBMIT}")]
        assert all(t["content"].startswith("THOUGHT: ") and "tool_calls" not in t for t in texts)
    with pytest.raises(ValueError, match="protocol"):
        plan(None, "xml")


@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                    reason="needs bubblewrap (make sysdeps) and root for overlay mounts")
@pytest.mark.parametrize("harness, n_tasks", [("builtin", 6), ("mini_swe_agent_text", 2), ("openhands", 1)])
def test_teacher_demonstrations_through_the_real_loop_are_graded_and_saved(harness, n_tasks, tiny_model, tmp_path):
    """The builtin agent, the real mini-swe-agent CLI in its text format and the real OpenHands SDK
    (docs/harnesses.md): each task solved or not in a sandbox, graded by its tests."""
    if harness == "openhands":
        from test_harness_openhands import require_openhands
        require_openhands()
    tasks = tmp_path / "tasks"
    gen.generate("pyfix-hint", "train", 7, n_tasks, tasks)
    pool = {"harness": harness, "prompt_style": "instruction", "max_agents": 2, "max_booting": 2,
            "adapter": {"max_new_tokens": 96, "max_context": 8192 if harness != "openhands" else 16384}, "lease_s": 60,
            "tools_dir": str(tmp_path / "tools")}
    cfg = tmp_path / "teach.yaml"
    cfg.write_text(yaml.safe_dump({"eval": {"tasks": str(tasks), "n_samples": 2, "seed": 3, "engine": "teacher",
                                            "teacher_accuracy": 0.5, "save_samples": True, "pool": pool}}))
    out = tmp_path / "teacher"
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", str(tiny_model), "--config", str(cfg),
                        "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    teacher = Teacher(0.5, seed=3)
    for res in results:
        right = teacher.mistake(attempt_seed(3, res["task"], res["attempt"])) is None
        assert res["reward"] == (1.0 if right else 0.0), res
    assert 0 < sum(res["reward"] for res in results) < len(results)
    samples = load_samples([out / "samples"])
    assert len(samples) == len(results) == 2 * n_tasks                # one sample an attempt: no fork
    assert sorted(s.reward for s in samples) == sorted(res["reward"] for res in results)
    assert all(s.loss_mask.sum() > 30 and s.loss_mask.sum() < len(s.tokens) / 3 for s in samples)


@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                    reason="needs bubblewrap (make sysdeps) and root for overlay mounts")
def test_the_teacher_fixes_a_real_projects_bug_from_its_fix_hint(tiny_model, tmp_path):
    """Mutation tasks of listkit (tests/data/mutations) made with --hints fix: the teacher's fix command finds
    the hint's sed in a real project's issue, and the project's own tests grade it, right exactly when it is."""
    tasks = tmp_path / "tasks"
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "generate", "mutations", "--source",
                        str(ROOT / "tests/data/mutations/listkit"), "--n", "3", "--split", "train", "--seed", "0",
                        "--hints", "fix", "--out", str(tasks)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    for task in sorted(tasks.glob("mutations-*")):
        said = (task / "instruction.md").read_text()
        assert re.search(r"`sed -i '\d+s/.+/' [\w/.]+` makes the fix", said) and "The bug is in `" in said, said
    rewards, right = teacher_attempts(tasks, tiny_model, tmp_path / "teacher", 4)
    assert len(rewards) == 12 and 0 < sum(right) < 12
    assert rewards == [1.0 if ok else 0.0 for ok in right]


def teacher_attempts(tasks: Path, model: Path, out: Path, n_samples: int) -> tuple[list[float], list[bool]]:
    """`agentrl eval` of the scripted teacher (accuracy 0.5, seed 1) on TASKS with the builtin agent: each
    attempt's reward, and whether the teacher drew the right plan for it."""
    pool = {"harness": "builtin", "prompt_style": "instruction", "max_agents": 2, "max_booting": 2,
            "adapter": {"max_new_tokens": 96, "max_context": 8192}, "lease_s": 60}
    cfg = out.with_suffix(".yaml")
    cfg.write_text(yaml.safe_dump({"eval": {"tasks": str(tasks), "n_samples": n_samples, "seed": 1,
                                            "engine": "teacher", "teacher_accuracy": 0.5, "pool": pool}}))
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", str(model), "--config", str(cfg),
                        "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    teacher = Teacher(0.5, seed=1)
    return ([res["reward"] for res in results],
            [teacher.mistake(attempt_seed(1, res["task"], res["attempt"])) is None for res in results])
