"""No answer within the agent's reach (issue 45): the history beyond HEAD stripped at baseline, and
`agentrl tasks check --leaks` searching each task's sandbox for its solution.

Each route by which a repository can hold the fix (tests/leak_routes.py) is attacked in real bwrap sandboxes:
an agent that takes the answer from git history earns 0 by default and 1 with `history = "keep"`, and the
audit flags every kept route (it is not a no-op) and a copy in site-packages whatever the history.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from leak_routes import FILE_ROUTE, FIXED_FILE, ROUTES, git, make_task

from agentrl.swe import history
from agentrl.swe.harbor import BUNDLED_TASKS
from agentrl.swe.leaks import MIN_LINE, fix_marks, git_blob_id

ROOT = Path(__file__).resolve().parents[1]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                 reason="needs bubblewrap (make sysdeps) and root for overlay mounts")


def _ids(repo: Path, *args: str) -> set[str]:
    return {line.split()[0] for line in git(repo, *args).splitlines() if line.strip()}


def _strip(repo: Path, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", history.STRIP_SCRIPT, "strip_history", str(repo), mode],
                          capture_output=True, text=True, timeout=120)


def _all_objects(git_dir: Path) -> set[str]:
    return _ids(git_dir.parent, f"--git-dir={git_dir}", "cat-file", "--batch-all-objects", "--batch-check")


# --- the stripping, on the host's git ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["ancestry", "head"])
def test_stripping_leaves_no_object_ref_or_reflog_beyond_head_on_any_route(tmp_path, mode):
    for route in ROUTES:
        repo = make_task(tmp_path, route) / "environment/repo"
        head = git(repo, "rev-parse", "HEAD").strip()
        if route != "submodule":     # the fixture is a leak: objects beyond HEAD's
            assert _all_objects(repo / ".git") > _ids(repo, "rev-list", "--objects", "HEAD"), route
        (repo / ".git/hooks").mkdir(exist_ok=True)
        (repo / ".git/hooks/post-checkout").write_text("#!/bin/sh\necho the image's hook\n")
        r = _strip(repo, mode)
        assert r.returncode == 0, f"{route}: {r.stderr}"
        gits = [repo / ".git", *([repo / ".git/modules/upstream"] if route == "submodule" else [])]
        for g in gits:
            objects = _all_objects(g)
            work = g.parent if g.name == ".git" else repo / "upstream"
            want = _ids(work, "rev-list", "--objects", "HEAD") if mode == "ancestry" else \
                _ids(work, "rev-list", "--objects", "--no-walk", "HEAD")
            assert objects == want, f"{route} {g}: objects beyond what {mode} keeps"
            refs = git(work, "for-each-ref", "--format=%(refname)").split()
            assert refs in ([], ["refs/heads/main"]), f"{route}: {refs}"
            assert not (g / "logs").exists() and not (g / "packed-refs").exists(), route
            assert not any((g / n).exists()
                           for n in ("ORIG_HEAD", "FETCH_HEAD", "MERGE_HEAD", "objects/info/alternates")), route
            assert git(work, "fsck", "--unreachable", "--no-reflogs", "--no-progress").strip() == "", route
            # as git init leaves it: empty, for the agent's own hooks (never run as root: test_sandbox_attacks)
            assert (g / "hooks").is_dir() and not any((g / "hooks").iterdir()), f"{route}: the image's hooks stayed"
        assert git(repo, "rev-parse", "HEAD").strip() == head, f"{route}: HEAD moved"
        assert git(repo, "status", "--porcelain").strip() == "", f"{route}: the work tree looks changed"
        if mode == "head":
            assert git(repo, "rev-list", "--count", "HEAD").strip() == "1"
            assert (repo / ".git/shallow").read_text().split() == [head]


def test_an_index_that_stages_the_fix_is_rebuilt_from_head(tmp_path):
    repo = make_task(tmp_path, "branch") / "environment/repo"
    buggy = (repo / FIXED_FILE).read_text()
    git(repo, "checkout", "-q", "fix", "--", FIXED_FILE)          # staged from the fix branch,
    (repo / FIXED_FILE).write_text(buggy)                         # the work tree's copy the buggy one
    fixed = git(repo, "show", f":{FIXED_FILE}")
    assert fixed != buggy
    assert _strip(repo, "ancestry").returncode == 0
    assert git(repo, "diff", "--cached", "--name-only").strip() == ""
    assert git_blob_id(fixed.encode()) not in _all_objects(repo / ".git")


def test_a_linked_worktrees_git_file_becomes_a_stripped_repository_of_its_own(tmp_path):
    main = make_task(tmp_path, "tag") / "environment/repo"
    wt = tmp_path / "wt"
    git(main, "worktree", "add", "-q", "--detach", str(wt), "main")
    assert (wt / ".git").is_file()
    assert _strip(wt, "ancestry").returncode == 0
    assert (wt / ".git").is_dir() and git(wt, "tag").strip() == ""
    assert _all_objects(wt / ".git") == _ids(wt, "rev-list", "--objects", "HEAD")
    assert not (main / ".git").exists()          # the repository it pointed into went, with the tag


def test_the_fix_is_marked_by_its_blob_and_the_lines_it_adds():
    before = b"def f(x):\n    return x + 1\n"
    after = b"def f(x):\n    return x - 1  # the fix\n    pass\n"
    (mark,) = fix_marks({"m.py": (before, after), "gone.py": (b"x = 1\n", None)})
    assert mark["path"] == "m.py"
    assert mark["lines"] == ["return x - 1  # the fix"]     # "pass" is too short to mark anything
    assert all(len(line) >= MIN_LINE for line in mark["lines"])
    hashed = subprocess.run(["git", "hash-object", "--stdin"], input=after, capture_output=True, check=True)
    assert mark["blob"] == hashed.stdout.decode().strip()


def test_conversion_and_image_builds_warn_of_history_beyond_head_and_launch_of_a_kept_one(tmp_path):
    tasks = [make_task(tmp_path, "branch"), make_task(tmp_path, "submodule"),
             make_task(tmp_path, "tag", history="keep"), BUNDLED_TASKS / "roman-subtractive"]
    jsonl = tmp_path / "prompts.jsonl"
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "convert", "harbor", *map(str, tasks),
                        "--out", str(jsonl)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    warned = {line.split()[2].rstrip(":"): line for line in r.stderr.splitlines() if line.startswith("warning: task ")}
    assert sorted(warned) == ["branch", "submodule", "tag-keep"], r.stderr
    assert "1 commit beyond HEAD (1 branch" in warned["branch"] and "strips it" in warned["branch"]
    assert "2 remote-tracking refs" in warned["submodule"]            # the submodule's git dir counts
    assert 'history = "keep"' in warned["tag-keep"] and "1 tag" in warned["tag-keep"]
    records = [json.loads(line)["metadata"] for line in jsonl.read_text().splitlines()]
    assert {m["instance_id"]: m["history"] for m in records} == {
        "branch": "head", "submodule": "head", "tag-keep": "keep", "roman-subtractive": "head"}
    assert "tag-keep" in history.keep_warning(jsonl) and "1 task(s)" in history.keep_warning(jsonl)
    (tmp_path / "clean.jsonl").write_text("".join(line + "\n" for line in jsonl.read_text().splitlines()
                                                  if '"keep"' not in line))
    assert history.keep_warning(tmp_path / "clean.jsonl") is None
    # a built image: its work tree's .git, read from the topmost tree that holds one
    image = tmp_path / "image"
    shutil.copytree(tasks[0] / "environment/repo", image / "testbed")
    (warning,) = history.image_warnings([tmp_path / "empty-top-layer", image], [("branch", "/testbed", "ancestry")])
    assert "task branch (the image's /testbed)" in warning and "1 branch" in warning
    assert history.image_warnings([image], [("branch", "/testbed", "head")])[0].endswith('(history = "head")')
    assert history.image_warnings([image], [("branch", "/elsewhere", "ancestry")]) == []


# --- in sandboxes: the hack, the audit ---------------------------------------------------------------------------

def _cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "check", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _git_history_hack(tasks: list[Path]) -> dict[tuple[str, str], float | None]:
    from agentrl.swe import hacks
    from agentrl.swe.loaded import load_tasks

    rows = asyncio.run(asyncio.wait_for(hacks.check_hacks(load_tasks(list(map(str, tasks))),
                                                           [hacks.BY_NAME["git-history"]], "both", 2), 300))
    return {(r.instance_id, r.grading): r.reward for r in rows}


@needs_bwrap
def test_the_answer_in_git_history_earns_nothing_by_default_and_everything_when_kept(tmp_path):
    rewards = _git_history_hack([make_task(tmp_path, r, history=h) for r in ROUTES for h in (None, "keep")])
    for route in ROUTES:
        for mode in ("isolated", "same"):
            assert rewards[(route, mode)] == 0.0, f"{route} {mode}: the stripped history still held the fix"
            assert rewards[(f"{route}-keep", mode)] == 1.0, f"{route}-keep {mode}: the hack is a dud"


@needs_bwrap
def test_the_audit_finds_the_answer_on_every_kept_route_and_in_site_packages(tmp_path):
    """The search is the costly part (a walk of the image, about 4 s a task): the kept routes, where it must
    find the fix, two stripped ones and a bundled task, where it must not, and a copy in an image's
    site-packages, which no history setting removes."""
    from hpc.images.hostroot import build_host_rootfs

    build_host_rootfs(tmp_path / "rootfs")
    kept = [make_task(tmp_path, r, history="keep") for r in ROUTES]
    stripped = [make_task(tmp_path, r) for r in ("submodule", "dangling-pack")]
    copy = make_task(tmp_path, FILE_ROUTE, image=str(tmp_path / "rootfs"))
    r = _cli(*kept, *stripped, copy, BUNDLED_TASKS / "roman-subtractive", "--hacks-only", "--hack", "git-history",
             "--grading", "same", "--leaks", "--json", "--concurrency", "2")
    assert r.returncode == 1, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    found = {row["instance_id"]: row for row in result["leaks"]}
    for route in ROUTES:
        (leak, *more) = found[f"{route}-keep"]["leaks"]
        assert leak["file"] == FIXED_FILE and leak["how"] == "the fixed file" and "git /testbed/.git" in leak["place"]
    for name in ("submodule", "dangling-pack", "roman-subtractive"):
        assert found[name]["leaks"] == [] and not found[name]["problem"], found[name]
    assert found[FILE_ROUTE]["leaks"] == [{"instance_id": FILE_ROUTE, "file": FIXED_FILE, "how": "the fixed file",
                                           "place": f"/usr/local/lib/python3/site-packages/{FIXED_FILE}"}]
    # one audit run covers both: the git route is in the hack set too, and fools the kept routes' grader
    assert result["flagged"] == len(ROUTES) * 2 + 1
    assert "refs/tags/v1.0.1" in r.stdout and "an unreachable object" in r.stdout and "refs/stash" in r.stdout


@needs_bwrap
def test_a_task_that_keeps_heads_ancestry_holds_no_answer_either(tmp_path):
    rewards = _git_history_hack([make_task(tmp_path, r, history="ancestry") for r in ROUTES])
    assert rewards == {(f"{route}-ancestry", mode): 0.0 for route in ROUTES for mode in ("isolated", "same")}


MUTANT_KEEPS_TAGS = (   # the ancestry pack also takes the tags' objects, and the tags stay
    'printf \'%s\\n\' "$head" | g --git-dir="$old" pack-objects --revs',
    '{ printf \'%s\\n\' "$head"; g --git-dir="$old" for-each-ref --format=\'%(objectname)\' refs/tags; } '
    '| g --git-dir="$old" pack-objects --revs')


@needs_bwrap
def test_stripping_that_keeps_one_ref_kind_is_caught(tmp_path, monkeypatch):
    from agentrl.swe import hacks
    from agentrl.swe.loaded import load_tasks

    tasks = load_tasks([str(make_task(tmp_path, "tag", history="ancestry"))])

    def rewards() -> list[float | None]:
        rows = asyncio.run(asyncio.wait_for(hacks.check_hacks(tasks, [hacks.BY_NAME["git-history"]], "same"), 300))
        return [r.reward for r in rows]
    assert rewards() == [0.0]
    old, new = MUTANT_KEEPS_TAGS
    assert old in history.STRIP_SCRIPT
    copy_tags = ('g --git-dir="$old" for-each-ref --format=\'%(objectname) %(refname)\' refs/tags | '
                 'while read -r o r; do printf \'%s\\n\' "$o" > "$new/$r"; done\n    chown -R')
    monkeypatch.setattr(history, "STRIP_SCRIPT", history.STRIP_SCRIPT.replace(old, new).replace("    chown -R",
                                                                                                copy_tags, 1))
    assert rewards() == [1.0]
