"""`agentrl tasks generate`: procedural Harbor tasks, graded as the bundled ones are.

Pure checks of the pyfix family (each bug kind changes the instruction's call, and the
instruction says truly what the code does), determinism, split disjointness, refusals, the
host check that refuses a task whose tests do not tell the fix from the bug, conversion, and
real `agentrl tasks check --hacks` runs in bwrap on a sample that covers every bug kind.
"""

import ast
import configparser
import dataclasses
import importlib.util
import json
import os
import random
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.swe import generate as gen
from agentrl.swe.families import FAMILIES, GenerationError, pyfix
from agentrl.swe.families.pyfix_templates import KINDS, TEMPLATES
from agentrl.swe.harbor import BUNDLED_TASKS
from agentrl.swe.task import decode_payload

ROOT = Path(__file__).resolve().parents[1]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                 reason="needs bubblewrap (make sysdeps) and root for overlay mounts")


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under root: relative path -> (bytes, mode)."""
    return {p.relative_to(root).as_posix(): (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
            for p in sorted(root.rglob("*")) if p.is_file()}


def make(out: Path, *args: str) -> int:
    return main(["tasks", "generate", "pyfix", "--out", str(out), *args])


# --- the verifier's one source -----------------------------------------------------------------------------------

def test_bundled_tasks_ship_the_canonical_verifier_and_the_wheel_carries_it(tmp_path):
    spec = importlib.util.spec_from_file_location("sync_verifier", ROOT / "tools" / "sync_verifier.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    stale_copies = tool.stale_copies
    assert set(gen.verifier_files()) == {"test.sh", "grade.py"}
    stale = stale_copies()
    assert stale == {}, f"these differ from agentrl/swe/verifier/: run `make verifier` ({sorted(map(str, stale))})"
    # and the target mends a stale copy
    copy = tmp_path / "tasks"
    shutil.copytree(BUNDLED_TASKS / "roman-subtractive", copy / "roman-subtractive")
    (copy / "roman-subtractive/tests/grade.py").write_text("# an old grader\n")
    assert list(stale_copies(copy)) == [copy / "roman-subtractive/tests/grade.py"]
    assert tool.main([str(copy)]) == 0 and stale_copies(copy) == {}
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    shipped = {s.strip() for s in cfg["options.package_data"]["agentrl.swe"].replace("\n", ",").split(",")}
    assert {"verifier/test.sh", "verifier/grade.py"} <= shipped


# --- the pyfix family, pure --------------------------------------------------------------------------------------

def _module(source: bytes) -> dict:
    ns: dict = {}
    exec(compile(source, "<module>", "exec"), ns)
    return ns


@pytest.mark.parametrize("kind", KINDS)
def test_each_bug_kind_changes_the_instructions_call_and_the_instruction_says_so(kind):
    seen = 0
    for make_spec in TEMPLATES:
        for i in range(20):
            spec = make_spec(random.Random(f"{kind}/{make_spec.__name__}/{i}"))
            for bug in (b for b in spec.bugs if b.kind == kind):
                d = pyfix.build(spec, bug, spec.names[0], "pkg", spec.modules[0])
                path = next(iter(d.fixed))
                call, file_, now, want = re.match(r"`(.+)` in `(.+)` (.+); it should (.+) \(", d.instruction).groups()
                assert file_ == path and call.startswith(spec.names[0] + "(")
                buggy, fixed = _module(d.repo[path]), _module(d.fixed[path])
                got = [pyfix.outcome(lambda ns=ns, c=call: eval(c, ns), ()) for ns in (buggy, fixed)]
                assert got[0] != got[1], d.instruction
                assert now == pyfix.says(got[0], True) and want == pyfix.says(got[1], False), d.instruction
                assert d.repo[path] != d.fixed[path] and d.metadata["bug_kind"] == kind
                seen += 1
    assert seen >= 40, f"only {seen} {kind} bugs drawn"


def test_every_template_draws_and_packages_are_no_stdlib_module():
    drawn = {pyfix.draw(random.Random(i)).metadata["template"] for i in range(400)}
    assert drawn == {t.__name__ for t in TEMPLATES}
    assert not set(pyfix.PACKAGES) & sys.stdlib_module_names
    assert {b.kind for t in TEMPLATES for b in t(random.Random(0)).bugs} == set(KINDS)


def test_instructions_are_one_sentence_of_one_shape():
    for _, d in gen.drafts("pyfix", "train", 0, 60):
        assert re.fullmatch(r"`[a-z_]+\(.*\)` in `[a-z]+/[a-z]+\.py` (returns|raises) .+; it should (return|raise) "
                            r".+ \(.+\)\. Fix the bug; the tests in tests/ show the intended behaviour, and "
                            r"`python3 -m unittest` runs them\.\n", d.instruction), d.instruction


# --- determinism and splits --------------------------------------------------------------------------------------

@pytest.mark.integration
def test_the_same_arguments_give_byte_identical_output_and_a_larger_n_extends_a_smaller(tmp_path):
    assert make(tmp_path / "a", "--n", "12", "--seed", "5", "--split", "train") == 0
    assert make(tmp_path / "b", "--n", "12", "--seed", "5", "--split", "train", "--jobs", "1") == 0
    a = tree(tmp_path / "a")
    assert a == tree(tmp_path / "b")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [f"pyfix-train-s5-{i:04d}" for i in range(12)]
    assert a["pyfix-train-s5-0000/solution/solve.sh"][1] == a["pyfix-train-s5-0000/tests/test.sh"][1] == 0o755
    assert a["pyfix-train-s5-0000/instruction.md"][1] == 0o644
    small, large = gen.drafts("pyfix", "train", 5, 4), gen.drafts("pyfix", "train", 5, 12)
    assert small == large[:4]
    assert [d.key for _, d in gen.drafts("pyfix", "train", 6, 12)] != [d.key for _, d in large]


def test_train_and_heldout_never_hold_the_same_task():
    train = {seed: gen.drafts("pyfix", "train", seed, 200) for seed in (0, 1)}
    heldout = gen.drafts("pyfix", "heldout", 0, 200)
    for seed, tasks in train.items():
        keys = [d.key for _, d in tasks]
        assert len(set(keys)) == len(keys), f"seed {seed}: a task repeats within the set"
        assert not set(keys) & {d.key for _, d in heldout}
        assert [n for n, _ in tasks] == [f"pyfix-train-s{seed}-{i:04d}" for i in range(200)]
    assert all(gen.split_of(d.key) == "heldout" for _, d in heldout)
    # not just the names: no (template, bug, constants) is in both, and both sets cover every kind
    assert {d.metadata["bug_kind"] for _, d in heldout} == set(KINDS) == {d.metadata["bug_kind"] for _, d in train[0]}


# --- refusals ----------------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_arguments_and_occupied_output_are_refused(tmp_path, capsys):
    assert main(["tasks", "generate", "nope", "--n", "2", "--split", "train", "--out", str(tmp_path / "x")]) == 2
    assert "'nope'" in capsys.readouterr().err and "pyfix" in FAMILIES
    for n in ("0", "-3"):
        assert make(tmp_path / "x", "--n", n, "--split", "train") == 2
        assert "--n must be" in capsys.readouterr().err
    assert make(tmp_path / "x", "--n", "2", "--split", "test") == 2
    assert "heldout" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

    out = tmp_path / "out"
    (out / "pyfix-train-s0-0000").mkdir(parents=True)          # an empty directory is no obstacle
    assert make(out, "--n", "2", "--split", "train") == 0
    first = tree(out)
    (out / "pyfix-train-s0-0001" / "instruction.md").write_text("edited\n")
    assert make(out, "--n", "3", "--split", "train") == 2
    err = capsys.readouterr().err
    assert "pyfix-train-s0-0000 exists and is not empty (and 1 more)" in err and "--force" in err
    assert not (out / "pyfix-train-s0-0002").exists()           # nothing written
    assert make(out, "--n", "2", "--split", "train", "--force") == 0
    assert tree(out) == first and not [p for p in out.iterdir() if p.name.startswith(".")]
    (tmp_path / "file").write_text("")
    assert make(tmp_path / "file", "--n", "1", "--split", "train") == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.integration
def test_a_task_whose_tests_do_not_tell_the_fix_from_the_bug_is_refused(tmp_path):
    name, d = gen.drafts("pyfix", "train", 0, 1)[0]
    gen.check_on_host(name, gen.layout(name, d, "pyfix", "train", 0), d)    # the real one passes
    no_bug = dataclasses.replace(d, repo={**d.repo, **d.fixed})
    with pytest.raises(GenerationError, match=rf"{name}: before the fix.*IssueTest.test_reported: ok"):
        gen.check_on_host(name, gen.layout(name, no_bug, "pyfix", "train", 0), no_bug)
    no_fix = dataclasses.replace(d, fixed={k: d.repo[k] for k in d.fixed})
    with pytest.raises(GenerationError, match=rf"{name}: after the fix.*IssueTest.test_reported: FAIL"):
        gen.check_on_host(name, gen.layout(name, no_fix, "pyfix", "train", 0), no_fix)
    unnamed = dataclasses.replace(d, pass_to_pass=d.pass_to_pass[1:])
    with pytest.raises(GenerationError, match="runs but expected.json does not name it"):
        gen.check_on_host(name, gen.layout(name, unnamed, "pyfix", "train", 0), unnamed)


# --- as Harbor tasks ---------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_generated_tasks_convert_and_are_laid_out_as_the_bundled_ones(tmp_path):
    out = tmp_path / "gen"
    assert make(out, "--n", "6", "--seed", "2", "--split", "heldout") == 0
    jsonl = tmp_path / "prompts.jsonl"
    assert main(["convert", "harbor", str(out), "--out", str(jsonl)]) == 0
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["metadata"]["instance_id"] for r in records] == [f"pyfix-heldout-s2-{i:04d}" for i in range(6)]
    for rec in records:
        t, md = out / rec["metadata"]["instance_id"], rec["metadata"]
        assert rec["prompt"] == (t / "instruction.md").read_text()
        assert (md["image"], md["workdir"], md["harbor"]["name"]) == ("host", "/testbed", f"agentrl/{t.name}")
        assert md["harbor"]["test_sh"].encode() == gen.verifier_files()["test.sh"]
        files = {k: decode_payload(v) for k, v in md["harbor"]["test_files"].items()}
        assert files["grade.py"] == gen.verifier_files()["grade.py"]
        repo_tests = {p.name: p.read_bytes() for p in (t / "environment/repo/tests").glob("test_*.py")}
        assert sorted(n for n in files if n.startswith("test_")) == sorted([*repo_tests, "test_issue.py"])
        assert all(files[n] == data for n, data in repo_tests.items())
        expected = json.loads(files["expected.json"])
        ids = {f"tests.{Path(n).stem}.{cls.name}.{f.name}" for n in files if n.startswith("test_")
               for cls in ast.parse(files[n]).body if isinstance(cls, ast.ClassDef)
               for f in cls.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test")}
        assert expected["FAIL_TO_PASS"] and all(n.startswith("tests.test_issue.") for n in expected["FAIL_TO_PASS"])
        assert sorted(expected["FAIL_TO_PASS"] + expected["PASS_TO_PASS"]) == sorted(ids), t.name


def cli_check(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "check", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.integration
@needs_bwrap
def test_generated_tasks_of_every_bug_kind_pass_their_oracle_fail_their_noop_and_defeat_every_hack(tmp_path):
    from agentrl.swe.hacks import HACKS

    out, sample = tmp_path / "gen", tmp_path / "sample"
    assert make(out, "--n", "20", "--seed", "0", "--split", "train") == 0
    first = {}
    for t in sorted(out.iterdir()):
        kind = re.search(r'bug_kind = "(.+)"', (t / "task.toml").read_text()).group(1)
        first.setdefault(kind, t)
    assert set(first) == set(KINDS)
    for t in first.values():
        shutil.copytree(t, sample / t.name)
    r = cli_check(sample, "--hacks", "--leaks", "--json", "--concurrency", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert [(t["leaks"], t["problem"]) for t in result["leaks"]] == [([], "")] * 5       # no answer in reach
    assert [(t["oracle_reward"], t["noop_reward"], t["problem"]) for t in result["tasks"]] == [(1.0, 0.0, "")] * 5
    assert len(result["hacks"]) == 5 * sum(h.default for h in HACKS) * 2
    assert [h for h in result["hacks"] if h["reward"] != 0.0 or h["problem"]] == []
    assert result["flagged"] == 0
