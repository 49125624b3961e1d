"""Tasks from a repository's own history (`agentrl tasks generate commits`): a history built here, offline,
from listkit (a bug committed, then its fix with the tests that catch it, and commits of every kind that is
no candidate), validated in real sandboxes, graded through test.sh and searched for leaks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_teacher import teacher_attempts

from agentrl.cli import main
from agentrl.swe.generate import split_of
from agentrl.swe.mutate.commits import Commit, candidate, file_patch, read_history
from agentrl.swe.mutate.issue import patch_hint
from agentrl.swe.mutate.project import SourceError

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
LISTKIT = ROOT / "tests/data/mutations/listkit"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                 reason="needs bubblewrap (make sysdeps) and root for overlay mounts")
FIXED = "    return [list(items[i:i + size]) for i in range(0, len(items), size)]\n"
BUGGY = "    return [list(items[i:i + size - 1]) for i in range(0, len(items), size)]\n"


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@example.com", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}     # the same shas every time: the same tasks
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout


def commit(repo: Path, message: str, files: dict[str, str | None]) -> str:
    for rel, text in files.items():
        if text is None:
            (repo / rel).unlink()
        else:
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def history(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """listkit's history: every kind of commit the family meets, one each."""
    repo = tmp_path / "listkit"
    shutil.copytree(LISTKIT, repo)
    chunks = (repo / "listkit/chunks.py").read_text()
    tests = (repo / "tests/test_chunks.py").read_text()
    git(repo, "init", "-q", "-b", "main")
    shas = {"root": commit(repo, "listkit, with a bug", {"listkit/chunks.py": chunks.replace(FIXED, BUGGY),
                                                           "tests/test_chunks.py": None})}
    shas["fix"] = commit(repo, "chunk: the last item of each chunk was lost\n\nchunk([1, 2, 3, 4], 2) gave [[1], [3]].",
                         {"listkit/chunks.py": chunks, "tests/test_chunks.py": tests})
    shas["docs"] = commit(repo, "README: usage", {"README.md": "usage\n"})
    shas["untested"] = commit(repo, "a helper nobody tests", {"listkit/extra.py": "def one():\n    return 1\n"})
    shas["feature"] = commit(repo, "pairs()", {   # its test imports what the parent lacks: the suite breaks
        "listkit/pairs.py": "def pairs(items):\n    return list(zip(items, items[1:]))\n",
        "tests/test_pairs.py": "import unittest\n\nfrom listkit.pairs import pairs\n\n\n"
                               "class PairsTest(unittest.TestCase):\n    def test_pairs(self):\n"
                               "        self.assertEqual(pairs([1, 2, 3]), [(1, 2), (2, 3)])\n"})
    git(repo, "checkout", "-q", "-b", "side")
    commit(repo, "on a side branch", {"listkit/side.py": "S = 1\n", "tests/test_side.py": "import unittest\n"})
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    shas["merge"] = git(repo, "rev-parse", "HEAD").strip()
    return repo, shas


def test_a_patch_adds_changes_and_deletes_files_as_git_apply_takes_them(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    write = {"a.py": "old\n", "gone.py": "x = 1\n", "tail.py": "no newline"}
    for rel, text in write.items():
        (repo / rel).write_text(text)
    patch = (file_patch("a.py", b"old\n", b"new\n") + file_patch("gone.py", b"x = 1\n", None)
             + file_patch("born.py", None, b"y = 2\n") + file_patch("tail.py", b"no newline", b"no newline\nmore\n"))
    subprocess.run(["git", "apply", "-"], input=patch, cwd=repo, check=True)
    assert sorted(p.name for p in repo.iterdir()) == ["a.py", "born.py", "tail.py"]
    assert (repo / "a.py").read_text() == "new\n" and (repo / "born.py").read_text() == "y = 2\n"
    assert (repo / "tail.py").read_text() == "no newline\nmore\n"


def test_what_a_commit_is_as_a_candidate():
    files = {"pkg/__init__.py": b"", "pkg/core.py": b"X = 2\n", "tests/test_core.py": b"import unittest\n"}
    c = candidate("p", Commit("c" * 40, "b" * 40, "msg", files, {"pkg/core.py": b"X = 1\n",
                                                                   "tests/test_core.py": None}))
    assert not isinstance(c, str) and c.code == ("pkg/core.py",) and c.tests == ("tests/test_core.py",)
    assert c.undo() == file_patch("pkg/core.py", b"X = 2\n", b"X = 1\n") and c.project.name == "p@cccccccccc"
    only_code = Commit("c" * 40, "b" * 40, "m", files, {"pkg/core.py": b"X = 1\n"})
    only_docs = Commit("c" * 40, "b" * 40, "m", {**files, "README": b"r\n"}, {"README": None,
                                                                               "tests/test_core.py": None})
    binary = Commit("c" * 40, "b" * 40, "m", {**files, "pkg/blob.py": b"\xff\n"}, {"pkg/blob.py": None,
                                                                                   "tests/test_core.py": None})
    assert [candidate("p", x) for x in (only_code, only_docs, binary)] == ["no-test-change", "no-code-change",
                                                                           "binary"]
    # Beside the code, a changelog, a .gitignore, docs' conf.py and setup.py: they stay as C has them
    others = {"CHANGES": b"x fixed\n", ".gitignore": b".tox/\n", "docs/conf.py": b"release = '2'\n",
              "setup.py": b"version = '2'\n"}
    docs_too = Commit("c" * 40, "b" * 40, "m", {**files, **others},
                      {"pkg/core.py": b"X = 1\n", "tests/test_core.py": None, **dict.fromkeys(others)})
    c = candidate("p", docs_too)
    assert not isinstance(c, str) and c.code == ("pkg/core.py",)
    assert c.fix() == file_patch("pkg/core.py", b"X = 1\n", b"X = 2\n")
    assert patch_hint(c.code, None) == "The change is in `pkg/core.py`."          # --hints location


def test_the_history_read_back_with_gits_plumbing(tmp_path):
    repo, shas = history(tmp_path)
    found, skipped = read_history(repo, "listkit")
    assert [c.commit.sha for c in found] == [shas["fix"], shas["feature"]]
    assert skipped == {"merge": 1, "root": 1, "no-test-change": 1, "no-code-change": 1, "binary": 0, "too-large": 0}
    fix = found[0]
    assert fix.code == ("listkit/chunks.py",) and fix.tests == ("tests/test_chunks.py",)
    assert fix.commit.message.startswith("chunk: the last item") and fix.commit.parent == shas["root"]
    with pytest.raises(SourceError, match="not the top of a git checkout"):
        read_history(repo / "listkit", "listkit")
    with pytest.raises(SourceError, match="git .* failed"):
        read_history(tmp_path / "nowhere", "x")


@pytest.mark.integration
@needs_bwrap
def test_tasks_from_history_validated_graded_reproducible_and_without_their_answer(tmp_path, capsys):
    repo, shas = history(tmp_path)
    found, _ = read_history(repo, "listkit")
    split = split_of(found[0].key)     # the fix's split; the feature commit's, tried or not, is refused

    def generate(out: str, n: int = 1, *more: str) -> int:
        return main(["tasks", "generate", "commits", "--source", str(repo), "--n", str(n), "--split", split,
                     "--seed", "0", "--test-timeout", "5", "--out", str(tmp_path / out), *more])
    assert generate("a") == 0
    said = capsys.readouterr().err
    assert "listkit: 6 commits, 2 candidates" in said and "merge 1, root 1, no-test-change 1, no-code-change 1" in said
    [task] = sorted((tmp_path / "a").glob("commits-*"))
    expected = json.loads((task / "tests/expected.json").read_text())
    assert expected["FAIL_TO_PASS"] == ["tests.test_chunks.ChunkTest.test_even",
                                        "tests.test_chunks.ChunkTest.test_short_last"]
    assert "tests.test_chunks.ChunkTest.test_size_checked" in expected["PASS_TO_PASS"]
    instruction = (task / "instruction.md").read_text()
    assert "> chunk: the last item of each chunk was lost" in instruction and "test_even" in instruction
    assert "size - 1" not in instruction and "i + size" not in instruction          # no diff in it
    repo_files = task / "environment/repo"
    assert BUGGY in (repo_files / "listkit/chunks.py").read_text()                  # the parent's code,
    assert (repo_files / "tests/test_chunks.py").read_text() == (repo / "tests/test_chunks.py").read_text()  # C's tests
    assert not (repo_files / ".git").exists() and not (repo_files / "listkit/pairs.py").exists()
    toml = (task / "task.toml").read_text()
    assert f'commit = "{shas["fix"]}"' in toml and f'parent = "{shas["root"]}"' in toml

    assert generate("b", 1, "--jobs", "1") == 0        # the same bytes again
    def tree(out: str) -> dict[str, bytes]:
        return {p.relative_to(tmp_path / out).as_posix(): p.read_bytes() for p in sorted((tmp_path / out).rglob("*"))
                if p.is_file() and ".mutations" not in p.parts}
    assert tree("a") == tree("b")

    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "check", str(task), "--leaks", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert [(t["oracle_reward"], t["noop_reward"], t["problem"]) for t in result["tasks"]] == [(1.0, 0.0, "")]
    leaks = [leak for t in result["leaks"] for leak in t["leaks"]]
    assert [leak for leak in leaks if not (leak["place"].startswith("/usr/") and Path(leak["place"]).is_file())] == []

    # more than the history holds: the command says how many it made, and why the rest were refused
    capsys.readouterr()
    assert generate("a", 2) == 1
    said = capsys.readouterr().err
    assert "gave 1 tasks, not 2" in said
    assert ("breaks-suite 1" in said) == (split_of(found[1].key) == split)


@needs_bwrap
def test_the_teacher_applies_the_patch_a_fix_hint_gives_right_exactly_when_it_is(tmp_path, tiny_model):
    """--hints fix: the files and the commit's patch in the instruction; the scripted teacher (its patch plan)
    solves the task through the real loop when its draw is right, and fails it on each mistake."""
    repo, _ = history(tmp_path)
    [fix, _] = read_history(repo, "listkit")[0]
    tasks = tmp_path / "tasks"
    assert main(["tasks", "generate", "commits", "--source", str(repo), "--n", "1", "--split", split_of(fix.key),
                 "--seed", "0", "--test-timeout", "5", "--hints", "fix", "--out", str(tasks)]) == 0
    [task] = sorted(tasks.glob("commits-*"))
    said = (task / "instruction.md").read_text()
    assert "The change is in `listkit/chunks.py`." in said and f"```diff\n{fix.fix().decode()}```" in said
    rewards, right = teacher_attempts(tasks, tiny_model, tmp_path / "teacher", 6)
    assert len(rewards) == 6 and 0 < sum(right) < 6
    assert rewards == [1.0 if ok else 0.0 for ok in right]


def test_what_the_commits_family_does_not_take_is_refused_by_name(tmp_path, capsys):
    base = ["tasks", "generate", "commits", "--n", "1", "--split", "train", "--out", str(tmp_path / "out")]
    for extra, said in (([], "--source"), (["--source", str(tmp_path / "nowhere")], "a git checkout's history"),
                        (["--source", str(LISTKIT), "--with", "pytest", "--image-cache", str(tmp_path)],
                         "--with: not for the commits family yet")):
        assert main([*base, *extra]) == 2
        assert said in capsys.readouterr().err
    assert main([*base, "--source", str(LISTKIT)]) == 1          # a directory, but no checkout of its own
    assert "not the top of a git checkout" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.slurm
@needs_bwrap
def test_commits_validated_as_slurm_arrays_make_the_same_task(tmp_path, slurm_env):
    repo, _ = history(tmp_path)
    [fix, _] = read_history(repo, "listkit")[0]
    args = ["tasks", "generate", "commits", "--source", str(repo), "--n", "1", "--split", split_of(fix.key),
            "--test-timeout", "5"]
    local = subprocess.run([sys.executable, "-m", "agentrl.cli", *args, "--out", str(tmp_path / "local")],
                           capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert local.returncode == 0, local.stderr
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", *args, "--out", str(tmp_path / "slurm"), "--slurm",
                        "--parallelism", "2"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env={**slurm_env, "AGENTRL_PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("validation runs as job") >= 2, r.stderr       # a commit's clean runs, then its candidate

    def tree(out: str) -> dict[str, bytes]:
        return {p.relative_to(tmp_path / out).as_posix(): p.read_bytes() for p in sorted((tmp_path / out).rglob("*"))
                if p.is_file() and ".mutations" not in p.parts}
    assert tree("slurm") == tree("local") != {}
