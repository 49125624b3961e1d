"""`agentrl tasks generate commits --source CHECKOUT...`: tasks from a repository's history, validated as mutants are.

Each source's candidates (commits.read_history) of the split (`generate.split_of` of the commit's key) are
shuffled by random.Random("commits/PROJECT/SPLIT/SEED") and validated in that order, --jobs commits at
once (with --slurm, --parallelism commits, each as job arrays of its own), each in its own sandboxes
(its clean tree is its commit's: build.judge_candidates, the result files under
--out/.mutations/PROJECT@SHA-DIGEST/, so a run cut short resumes), until the source's share of --n is
kept. A commit whose own tests do not pass is refused (`clean-fails`), as is one whose undone change
is the same patch as an earlier kept one's (`duplicate`). Tasks are named commits-SPLIT-sSEED-INDEX.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..families.base import Draft
from ..generate import Refused, layout, split_of, task_name
from . import issue
from .build import Options, Tally, judge_candidates, write_tasks
from .commits import SKIPS, CommitCandidate, read_history
from .project import SourceError, task_repository
from .verdict import REASONS, Verdict, dedupe

FAMILY = "commits"
MAX_COMMITS = 1000          # first-parent commits read back from HEAD
REFUSALS = (*REASONS, "clean-fails", "no-tests")


class OneCommit:
    """A commit's candidate as validation takes it (build.Candidates): its own project, and one candidate."""

    def __init__(self, c: CommitCandidate) -> None:
        self.project = c.project
        self.order = [c]

    def diff(self, c: CommitCandidate) -> bytes:
        return c.undo()

    def place(self, c: CommitCandidate) -> str:
        return c.place


def check(opts: Options) -> None:
    """What the commits family does not take (yet), refused by name."""
    given = [flag for flag, on in (("--with", any(opts.requirements)),
                                   ("--base-image", opts.base_image is not None)) if on]
    if given:
        raise Refused(f"{', '.join(given)}: not for the commits family yet (docs/tasks.md, 'Tasks from history'); "
                      "drop it, or use the mutations family")
    for source in opts.sources:
        if not Path(source).is_dir():
            raise Refused(f"--source {source}: the commits family reads a git checkout's history: name its directory")


def draft(name: str, c: CommitCandidate, v: Verdict, failures: dict[str, str], hints: str | None = None) -> Draft:
    """The task: P's code with C's tests (C's tree, its code change undone), the commit's message and its failing
    tests as the instruction; `hints` adds the files the fix changes ("location"), and the fix ("fix")."""
    repo = task_repository(c.project)
    for rel in c.code:
        before = c.commit.before[rel]
        if before is None:
            repo.pop(rel, None)
        else:
            repo[rel] = before
    message = "\n".join(f"> {line}".rstrip() for line in c.commit.message.splitlines()) or "> (no message)"
    hint = issue.patch_hint(c.code, c.fix() if hints == "fix" else None) if hints else None
    said = issue.instruction(name, v.fail_to_pass, failures, hint)
    return Draft(
        key=c.key,
        instruction=f"The change this repository needs, as its author described it:\n\n{message}\n\n{said}",
        repo=dict(sorted(repo.items())),
        fixed={rel: c.commit.files[rel] for rel in c.code if rel in c.commit.files},
        hidden={},
        fail_to_pass=v.fail_to_pass,
        pass_to_pass=v.pass_to_pass,
        description=f"commit {c.commit.sha[:10]} of {name}: {(c.commit.message.splitlines() or [''])[0]}",
        metadata={"project": name, "commit": c.commit.sha, "parent": c.commit.parent,
                  "files": " ".join(c.code)},
    )


Judged = tuple[CommitCandidate, Verdict, dict[str, str]]


def _judge(c: CommitCandidate, opts: Options) -> str | tuple[list[Judged], Tally]:
    """A commit validated in its own sandboxes: ([kept], tally), or the reason it could not be."""
    if not c.project.tests.dirs:
        return "no-tests"
    try:
        return judge_candidates(OneCommit(c), 1, opts)
    except SourceError:
        return "clean-fails"


def generate(opts: Options, progress: Callable[[str], None] = lambda s: None) -> list[Path]:
    """Validate each source's commits and write the tasks (the same bytes for the same history and arguments)."""
    check(opts)
    quotas = [opts.n // len(opts.sources) + (i < opts.n % len(opts.sources)) for i in range(len(opts.sources))]
    tasks: list[tuple[str, dict[str, bytes]]] = []
    for source, quota in zip(opts.sources, quotas, strict=True):
        checkout = Path(source)
        name = checkout.resolve().name
        found, skipped = read_history(checkout, name, MAX_COMMITS)
        mine = [c for c in found if split_of(c.key) == opts.split]
        random.Random(f"{FAMILY}/{name}/{opts.split}/{opts.seed}").shuffle(mine)
        progress(f"{name}: {len(found) + sum(skipped.values())} commits, {len(found)} candidates, {len(mine)} of "
                 f"them {opts.split}; not candidates: " +
                 (", ".join(f"{k} {skipped[k]}" for k in SKIPS if skipped[k]) or "none"))
        kept: list[Judged] = []
        refused: Counter = Counter()
        tried = 0
        width = opts.parallelism if opts.slurm else opts.jobs
        with ThreadPoolExecutor(max_workers=width) as pool:
            # `width` commits at once (with --slurm, each its own arrays), judged in order: the kept set is the
            # same whatever the width
            while len(kept) < quota and tried < len(mine):
                window = mine[tried:tried + width]
                for outcome in pool.map(lambda c: _judge(c, opts), window):
                    tried += 1
                    if isinstance(outcome, str):
                        refused[outcome] += 1
                    elif not outcome[0]:
                        refused.update(outcome[1].refused)
                    elif dedupe([(v, k.undo(), k.place) for k, v, _ in [*kept, outcome[0][0]]])[-1].kept:
                        kept.append(outcome[0][0])
                    else:           # the same patch undone as an earlier kept commit's (a revert and its redo)
                        refused["duplicate"] += 1
                    if len(kept) >= quota:
                        break
                progress(f"{name}: tried {tried} of {len(mine)}, kept {len(kept)} ({quota} wanted), refused "
                         f"{sum(refused.values())} (" +
                         (", ".join(f"{r} {refused[r]}" for r in REFUSALS if refused[r]) or "none") + ")")
        if len(kept) < quota:
            raise SourceError(f"{name}: {len(mine)} {opts.split} commits gave {len(kept)} tasks, not {quota}: lower "
                              "--n, or give a checkout with more history (commits that change code and tests)")
        for c, v, failures in kept:
            index = len(tasks)
            d = draft(name, c, v, failures, opts.hints)
            files = layout(task_name(FAMILY, opts.split, opts.seed, index), d, FAMILY, opts.split, opts.seed,
                           issue.solve_sh(c.fix(), "the commit's own change to the code"), suite=c.project.tests)
            tasks.append((task_name(FAMILY, opts.split, opts.seed, index), files))
    return write_tasks(opts, tasks)
