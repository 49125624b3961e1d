"""tests/data/learning, the learning test's warm start and probe (tools/learning_fixture.py): current, and
refused when it is not.

The committed fixture must have been made from the tokenizer and tasks the code makes now, so that a
change that makes them otherwise fails here in seconds, naming the command that remakes it, not after
the learning test's five minutes of GRPO. Each refusal is checked on a copy with one thing changed.
"""

import json
import shutil
from dataclasses import replace

import pytest
from learning_support import load

from agentrl.train.sft import load_samples

pytestmark = pytest.mark.integration


fx = load("tools/learning_fixture.py")
bench = fx.learning_bench


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The inputs the test makes (tokenizer, tasks, configs), with the committed fixture's settings."""
    work = tmp_path_factory.mktemp("learning") / "w"
    manifest = fx.read_manifest(fx.FIXTURE)
    args = bench.parser().parse_args([*manifest["args"], "--work", str(work)])
    bench.Stages(args, work).inputs()
    return manifest, args, work


def test_the_committed_fixture_was_made_from_what_the_code_makes_now(made, tmp_path):
    manifest, args, work = made
    fx.unpack(fx.FIXTURE, manifest, work, args)
    assert (work / "warm" / "model.safetensors").stat().st_size > 0
    tasks = {p.name for p in (work / "train").iterdir()}
    assert len(tasks) == args.train_tasks and set(manifest["prompts"]) == tasks, \
        "a demonstration's first prompt recorded for every train task"
    probe = load_samples([fx.FIXTURE / "probe"])
    assert {s.metadata.task for s in probe} == {p.name for p in (work / args.split).iterdir()}
    assert len(probe) == args.eval_tasks * bench.PROBE_N


def test_a_fixture_made_with_other_settings_is_refused(tmp_path):
    fixture = tmp_path / "fixture"
    fixture.mkdir()
    with pytest.raises(fx.StaleFixture, match="manifest.json: missing: make the fixture with"):
        fx.read_manifest(fixture)
    manifest = json.loads((fx.FIXTURE / "manifest.json").read_text())
    argv = manifest["args"]
    manifest["args"] = [*argv[:argv.index("--rollouts") + 1], "5", *argv[argv.index("--rollouts") + 2:]]
    (fixture / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(fx.StaleFixture, match="not the test's settings .*python tools/learning_fixture.py"):
        fx.read_manifest(fixture)
    manifest["args"] = [*argv[:argv.index("--seed") + 1], "9", *argv[argv.index("--seed") + 2:]]
    (fixture / "manifest.json").write_text(json.dumps(manifest))
    assert fx.read_manifest(fixture)["args"] == manifest["args"], "another seed is a calibration fixture"


@pytest.mark.parametrize("changed", ["base/tokenizer.json", "train.jsonl", "heldout/"])
def test_a_fixture_made_from_other_inputs_is_refused_naming_what_differs(made, tmp_path, changed):
    manifest, args, work = made
    copy = tmp_path / "w"
    shutil.copytree(work, copy, ignore=shutil.ignore_patterns("warm"))
    target = copy / changed
    if target.is_dir():
        target = sorted(p for p in target.rglob("*.md") if p.is_file())[0]
    target.write_bytes(target.read_bytes() + b" ")
    with pytest.raises(fx.StaleFixture, match=f"{changed} differ.*remake it with `python tools/learning_fixture.py`"):
        fx.unpack(fx.FIXTURE, manifest, copy, args)
    assert not (copy / "warm").exists()


def test_a_run_whose_prompts_differ_from_the_demonstrations_is_refused():
    probe = load_samples([fx.FIXTURE / "probe"])
    manifest = {"prompts": fx.first_prompts(probe)}
    fx.check_prompts(manifest, probe, fx.FIXTURE)     # every attempt at a task began with the same prompt
    s = probe[0]
    tokens = s.tokens.copy()
    tokens[s.prompt_length // 2] += 1
    with pytest.raises(fx.StaleFixture, match=f"task {s.metadata.task}'s first {s.prompt_length} tokens differ"):
        fx.check_prompts(manifest, [replace(s, tokens=tokens)], fx.FIXTURE)
    with pytest.raises(fx.StaleFixture, match="has no demonstration of task nope"):
        fx.check_prompts(manifest, [replace(s, metadata=s.metadata.model_copy(update={"task": "nope"}))], fx.FIXTURE)
