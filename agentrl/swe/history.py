"""No answer in the repository's git history: stripped in the sandbox at baseline, reported at conversion.

A task's repository is a clone, and a clone can hold the fix: on a branch or a tag past HEAD, in a
remote-tracking ref, a reflog, a stash, a dangling commit in a pack, a submodule's history. SWE-bench's
images did, until their history was cut (SWE-bench issue 465), and an agent whose whole work is
`git checkout <that ref> -- .` earns the reward without solving anything; under GRPO the trick spreads.

So before the agent starts, `strip` rebuilds every git directory of the work tree from a whitelist
(sandbox_scripts/strip_history.sh): what the task's `history` keeps (TaskSpec.history: HEAD's ancestry,
HEAD alone, or everything with "keep") and nothing else. `beyond_head` counts what a repository on this
host holds past HEAD, for the warnings of `agentrl convert harbor` and `agentrl images build`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from hpc.sandbox.base import Sandbox, SandboxError

from .task import History

log = logging.getLogger("agentrl.swe")

STRIP_SCRIPT = (Path(__file__).with_name("sandbox_scripts") / "strip_history.sh").read_text()
STRIP_TIMEOUT_S = 600.0
# What the sandbox's baseline does with each setting, in words (warnings, docs).
WHAT_STAYS = {"ancestry": "HEAD and its ancestors", "head": "HEAD's commit alone (shallow, depth 1)",
              "keep": "everything the image's .git holds"}


async def strip(sb: Sandbox, workdir: str, history: History) -> None:
    """The repository at `workdir` (and every repository inside it) keeps what `history` says, nothing more."""
    if history == "keep":
        return
    r = await sb.exec(["sh", "-c", STRIP_SCRIPT, "strip_history", workdir, history], user="root", cwd="/",
                      timeout_s=STRIP_TIMEOUT_S)
    if r.exit_code != 0 or r.timed_out:
        said = (r.stderr or r.stdout).decode(errors="replace").strip()[-2000:]
        how = "timed out" if r.timed_out else f"failed ({r.exit_code})"
        raise SandboxError(f"stripping the git history beyond HEAD ({history}) {how}: {said}")


@dataclass(frozen=True)
class Beyond:
    """What a repository holds past HEAD's ancestry (refs by kind, reflogs, commits), for a warning."""
    refs: dict[str, int]      # kind (branch, tag, remote-tracking ref, stash, notes ref...) -> count
    reflogs: int              # files under logs/
    commits: int              # commits reachable from those refs or reflogs and not from HEAD

    @property
    def empty(self) -> bool:
        """Nothing past HEAD that a ref or reflog reaches (refs into HEAD's ancestry, a clone's reflogs of
        HEAD, are no answer). Dangling objects are not counted: finding them takes a whole fsck."""
        return not self.commits

    def describe(self) -> str:
        parts = [_counted(n, kind) for kind, n in sorted(self.refs.items())]
        if self.reflogs:
            parts.append(_counted(self.reflogs, "reflog"))
        return f"{_counted(self.commits, 'commit')} beyond HEAD ({', '.join(parts) or 'no ref'})"


_REF_KINDS = (("refs/heads/", "branch"), ("refs/tags/", "tag"), ("refs/remotes/", "remote-tracking ref"),
              ("refs/stash", "stash"), ("refs/notes/", "notes ref"), ("refs/replace/", "replace ref"))


def _counted(n: int, noun: str) -> str:
    plural = noun + ("es" if noun.endswith(("h", "s")) else "s")
    return f"{n} {noun if n == 1 else plural}"


def _git(git_dir: Path, *args: str) -> str:
    """A read-only git command on a repository that is not ours: no system or global config, no hooks or
    fsmonitor of its own config."""
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "HOME": os.devnull, "GIT_TERMINAL_PROMPT": "0",
           "LC_ALL": "C"}
    r = subprocess.run([shutil.which("git") or "/usr/bin/git", "-c", "safe.directory=*", "-c", "core.fsmonitor=false",
                        "-c", "core.hooksPath=/dev/null", f"--git-dir={git_dir}", *args],
                       capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {git_dir}: {r.stderr.strip()[-500:]}")
    return r.stdout


def beyond_head(repo: Path) -> Beyond | None:
    """What `repo`'s .git (a work tree on this host) and its submodules' git dirs (.git/modules/) hold past
    their HEAD's ancestry, summed; None without a readable .git."""
    top = Path(repo) / ".git"
    if not top.is_dir() or top.is_symlink():
        return None
    modules = sorted(p.parent for p in (top / "modules").rglob("HEAD") if (p.parent / "objects").is_dir())
    found = [b for b in map(_beyond, [top, *modules]) if b is not None]
    if not found:
        return None
    refs: Counter[str] = Counter()
    for b in found:
        refs.update(b.refs)
    return Beyond(dict(refs), sum(b.reflogs for b in found), sum(b.commits for b in found))


def _beyond(git_dir: Path) -> Beyond | None:
    try:
        head_ref = _git(git_dir, "symbolic-ref", "-q", "HEAD").strip() if (git_dir / "HEAD").read_text(
            errors="replace").startswith("ref:") else ""
        refs: Counter[str] = Counter()
        for name in _git(git_dir, "for-each-ref", "--format=%(refname)").split():
            if name == head_ref:
                continue
            refs[next((kind for prefix, kind in _REF_KINDS if name.startswith(prefix)), "other ref")] += 1
        reflogs = sum(len(files) for _, _, files in os.walk(git_dir / "logs"))
        has_head = bool(_git(git_dir, "rev-parse", "-q", "--verify", "HEAD^{commit}").strip()) \
            if (git_dir / "HEAD").exists() else False
        commits = int(_git(git_dir, "rev-list", "--count", "--all", "--reflog",
                           *(("--not", "HEAD") if has_head else ())).strip() or 0)
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        log.debug("cannot read %s: %s", git_dir, e)
        return None
    return Beyond(dict(refs), reflogs, commits)


def task_warnings(task_dir: Path, instance_id: str, history: History) -> list[str]:
    """`agentrl convert harbor`'s warnings for one Harbor task: each repository its environment/ holds (the
    directory itself, or one directly inside it: a host task's testbed, a build context's clone) that has
    history beyond HEAD, or the task's `history = "keep"`."""
    env = Path(task_dir) / "environment"
    places = [env, *sorted(p for p in env.iterdir() if p.is_dir() and not p.is_symlink())] if env.is_dir() else []
    found = [(d, beyond_head(d)) for d in places if (d / ".git").is_dir()]
    if history == "keep":
        worst = max(found, key=lambda f: f[1].commits if f[1] else -1, default=(env, None))
        text = conversion_warning(f"task {instance_id}", worst[1], history)
        return [text] if text else []
    return [text for d, beyond in found
            if (text := conversion_warning(f"task {instance_id} ({d.relative_to(task_dir)})", beyond, history))]


def image_warnings(roots: list[Path], tasks: list[tuple[str, str, History]]) -> list[str]:
    """`agentrl images build`'s warnings for a built image, as file trees (a rootfs, or its layers top first:
    the topmost holding the work tree's .git is read), per task (instance id, workdir, history) using it."""
    out = []
    for iid, workdir, history in tasks:
        repo = next((root / workdir.lstrip("/") for root in roots
                     if (root / workdir.lstrip("/") / ".git").is_dir()), None)
        beyond = beyond_head(repo) if repo is not None else None
        if text := conversion_warning(f"task {iid} (the image's {workdir})", beyond, history):
            out.append(text)
    return out


def keep_warning(prompts: Path) -> str | None:
    """`agentrl launch`'s warning when tasks of the prompt data keep their history (None when none does or
    the file cannot be read: the launch's own checks say why)."""
    import json
    kept = []
    try:
        with open(prompts, encoding="utf-8", errors="replace") as f:
            for line in f:
                if '"keep"' not in line:      # a data set's lines are long: parse only the candidates
                    continue
                meta = json.loads(line).get("metadata")
                if isinstance(meta, dict) and meta.get("history") == "keep":
                    kept.append(str(meta.get("instance_id")))
    except (OSError, ValueError, AttributeError):
        return None
    if not kept:
        return None
    names = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
    return (f"{len(kept)} task(s) of {prompts} keep their repository's git history (history = \"keep\": {names}): "
            "a fix on a ref, a reflog or a stash there is within the agent's reach; `agentrl tasks check --leaks` "
            "finds it")


def conversion_warning(where: str, beyond: Beyond | None, history: History) -> str | None:
    """The warning `agentrl convert harbor` and `agentrl images build` print for one task, or None."""
    if history == "keep":
        return (f"{where}: history = \"keep\": the agent sees the repository's .git as it is"
                + (f", {beyond.describe()}" if beyond is not None and not beyond.empty else "")
                + "; a fix on any ref, reflog or stash there is within its reach (`agentrl tasks check --leaks`)")
    if beyond is None or beyond.empty:
        return None
    return (f"{where}: the repository's .git holds {beyond.describe()}; the sandbox strips it at baseline, "
            f"keeping {WHAT_STAYS[history]} (history = \"{history}\")")
