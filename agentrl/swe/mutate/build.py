"""`agentrl tasks generate mutations --source SPEC...`: tasks from real projects' bugs, validated by their tests.

For each source (a checkout, an sdist, a requirement): every bug operator's every site in its modules
is a candidate, keyed by what it is (project, file, operator, line, the code before and after). A
key's split is the generator's (`generate.split_of`), so train and heldout never share a mutant; the
candidates of one split are shuffled by random.Random("mutations/PROJECT/SPLIT/SEED") and validated
in that order until the source's share of --n is kept. The clean tree runs --clean-runs times first.
Each verdict is a function of result files (runner.py), so the kept set, and each task's bytes,
depend on the seed and the projects alone, however often a run was cut short and resumed: a re-run
reads the results it has and validates only what is missing. Tasks i = 0.. are the kept mutants of
the first source, then the next source's, named as every family's are (`generate.task_name`).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hpc.images.cache import ImageCache

from ..generate import HINTS, SPLITS, Refused, layout, occupied, split_of, task_name, write_task
from ..task import HOST_IMAGE, Resources
from . import issue, slurm
from .operators import Mutator, Site
from .project import Project, SourceError, load, task_repository
from .requirements_image import (
    DEFAULT_BASE,
    IMAGE_BUILDS,
    RequirementsImage,
    check_requirement,
    fetch,
    require_images,
    work_name,
)
from .runner import Job, read_result, run_jobs, suite_spec
from .verdict import REASONS, Baseline, Verdict, baseline, dedupe, judge, unified_diff

FAMILY = "mutations"
WORK = ".mutations"              # under --out: hidden, so `convert harbor` and `tasks check` pass it by
RESOURCES = Resources(cpus=1, mem_mb=512)   # what task_toml gives every generated task
MAX_BATCH = 64


@dataclass(frozen=True)
class Options:
    """The command's arguments, checked once here."""
    sources: tuple[str, ...]
    n: int
    seed: int
    split: str
    out: Path
    hints: str | None = None          # None, or one of HINTS: what the instruction tells of the bug
    force: bool = False
    jobs: int = 2
    clean_runs: int = 3
    timeout_s: float = 20.0
    find_links: Path | None = None
    scratch: str | None = None
    slurm: bool = False               # each batch as a job array (slurm.py)
    parallelism: int = 8              # with slurm: array tasks at once
    sbatch_options: tuple[str, ...] = ()
    requirements: tuple[tuple[str, ...], ...] = ()     # per source, what its tests need (--with); () for none
    base_image: str | None = None
    image_cache: Path | None = None

    def __post_init__(self) -> None:
        if not self.sources:
            raise Refused("mutations needs --source: a project checkout, an sdist (.tar.gz) or a requirement")
        if self.requirements and len(self.requirements) != len(self.sources):
            raise Refused(f"{len(self.requirements)} requirement lists for {len(self.sources)} sources")
        try:
            for reqs in self.requirements:
                for r in reqs:
                    check_requirement(r)
        except SourceError as e:
            raise Refused(str(e)) from None
        if any(self.requirements) and self.image_cache is None:
            raise Refused("--with needs --image-cache DIR: validation runs in the image the tasks will use, found "
                          "there (it is built with `agentrl images build ... --cache DIR`)")
        if self.base_image is not None and not any(self.requirements):
            raise Refused("--base-image is the image of a source with --with: add --with after that --source, or "
                          "drop --base-image")
        if self.clean_runs < 2:
            raise Refused(f"--clean-runs must be at least 2 (one run cannot show a flaky test), got {self.clean_runs}")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise Refused(f"--test-timeout must be a positive number of seconds, got {self.timeout_s}")
        if self.split not in SPLITS:
            raise Refused(f"unknown split {self.split!r}: choose one of {', '.join(SPLITS)}")
        if isinstance(self.n, bool) or self.n < 1:
            raise Refused(f"--n must be a whole number of tasks, at least 1; got {self.n!r}")
        if self.jobs < 1:
            raise Refused(f"--jobs must be at least 1, got {self.jobs}")
        if self.parallelism < 1:
            raise Refused(f"--parallelism must be at least 1, got {self.parallelism}")
        if self.hints not in (None, *HINTS):
            raise Refused(f"unknown --hints {self.hints!r}: choose one of {', '.join(HINTS)}")
        if self.sbatch_options and not self.slurm:
            raise Refused("--sbatch-option is for --slurm: add --slurm, or drop it")


@dataclass
class Candidate:
    key: str
    path: str
    site: Site

    @property
    def id(self) -> str:
        return hashlib.sha256(self.key.encode()).hexdigest()[:20]


@dataclass
class Tally:
    """What a source's validation has come to, for the progress line and the report."""
    built: int = 0
    kept: int = 0
    refused: Counter = field(default_factory=Counter)

    def line(self, name: str, quota: int, left: int) -> str:
        reasons = ", ".join(f"{r} {self.refused[r]}" for r in REASONS if self.refused[r]) or "none"
        # kept can pass the quota: a batch validates all of its candidates, and the spares serve a larger --n
        return (f"{name}: built {self.built}, kept {self.kept} ({quota} wanted), refused {sum(self.refused.values())} "
                f"({reasons}), remaining {max(0, quota - self.kept)} to keep, {left} candidates untried")


class Mutants:
    """A project's candidates of one split in validation order, and the mutated source of each (pure)."""

    def __init__(self, project: Project, split: str, seed: int, hints: str | None = None) -> None:
        self.project = project
        self._mutators: dict[str, Mutator | None] = {}
        found = []
        for path in project.mutable():
            mutator = self._mutator(path)
            for site in mutator.sites if mutator else []:
                key = json.dumps({"project": project.name, "path": path, "operator": site.operator,
                                  "line": site.line, "index": site.index, "before": site.before,
                                  "after": site.after}, sort_keys=True)
                if split_of(key) == split:
                    found.append(Candidate(key, path, site))
        random.Random(f"{FAMILY}/{project.name}/{split}/{seed}").shuffle(found)
        # With the fix as a hint, only the candidates whose fix is one sed replacement, in the same order:
        # the hinted set of a seed is a subsequence of the plain one, and shares its result files
        self.order = [c for c in found if issue.fixable(c.path, project.files[c.path], c.site)] if hints == "fix" \
            else found

    def _mutator(self, path: str) -> Mutator | None:
        if path not in self._mutators:
            try:
                self._mutators[path] = Mutator(self.project.files[path].decode())
            except Exception as e:   # libcst's parser errors, a file that is not UTF-8: no candidates there
                print(f"{self.project.name}/{path}: not mutated ({type(e).__name__}: {e})", file=sys.stderr)
                self._mutators[path] = None
        return self._mutators[path]

    def mutated(self, c: Candidate) -> str:
        mutator = self._mutator(c.path)
        assert mutator is not None, "a candidate comes from a parsed module"
        return mutator.mutate(c.site.index)

    def diff(self, c: Candidate) -> bytes:
        return unified_diff(c.path, self.project.files[c.path].decode(), self.mutated(c))

    def place(self, c: Candidate) -> str:
        """Where the bug is, for duplicates: the file and function."""
        return f"{c.path}:{c.site.function}"


class Candidates(Protocol):
    """What validation needs of a family's candidates (Mutants, commits.OneCommit): the project whose clean
    tree runs, the candidates in order (each with an `id`), each one's patch and place."""
    @property
    def project(self) -> Project: ...

    @property
    def order(self) -> Sequence[Any]: ...

    def diff(self, c: Any) -> bytes: ...

    def place(self, c: Any) -> str: ...


def _run(project: Project, work: Path, opts: Options, spec, todo: list[Job], workers: int) -> None:
    """The jobs' result files: in sandboxes here, `workers` at once, or with --slurm as one job array."""
    if opts.slurm:
        slurm.submit_batch(work, task_repository(project), spec, todo, parallelism=opts.parallelism,
                           timeout_s=opts.timeout_s, scratch=opts.scratch, sbatch_options=opts.sbatch_options,
                           image_cache=opts.image_cache)
    else:
        run_jobs(task_repository(project), spec, todo, workers=workers, timeout_s=opts.timeout_s,
                 scratch=opts.scratch, cache=ImageCache(opts.image_cache) if opts.image_cache else None)


def shown_command(command: list[str]) -> str:
    """A suite's command line for a message: unittest's loader over several test directories by its name."""
    if "-c" in command:
        at = command.index("-c")
        command = [*command[:at], "-c", "<grade.py's DISCOVER_DIRS>", *command[at + 2:]]
    return " ".join(command)


def _clean(project: Project, work: Path, opts: Options, spec, environment: RequirementsImage | None) -> Baseline:
    path = work / "clean.json"
    if read_result(path) is None:
        _run(project, work, opts, spec, [Job(path, b"", opts.clean_runs)], workers=1)
    runs = read_result(path) or []
    base = baseline(runs)
    if not base.passing:
        said = next((f for r in runs for f in r.failures.values()), "") or ("the run timed out" if any(
            r.timed_out for r in runs) else "no test ran")
        where = (f"in its image, with {', '.join(environment.requirements)} installed" if environment else
                 "nothing installed")
        raise SourceError(f"{project.name}: no test passes on the clean tree, run as the grader runs it "
                          f"({shown_command(spec.eval_command)} in the repository, {where}): {said[-800:]}\nMake the "
                          f"suite pass that way (a third-party dependency of the tests: --with it after the "
                          f"--source; pytest-style tests: --with pytest), or choose another source")
    return base


def validate(mutants: Candidates, quota: int, opts: Options, progress: Callable[[str], None] = lambda s: None,
             environment: RequirementsImage | None = None) -> list[tuple[Any, Verdict, dict[str, str]]]:
    """The first `quota` kept candidates, each with its verdict and its failures' excerpts; SourceError when
    the candidates run out first."""
    kept, tally = judge_candidates(mutants, quota, opts, progress, environment)
    if len(kept) < quota:
        raise SourceError(f"{mutants.project.name}: {len(mutants.order)} {opts.split} candidates gave {len(kept)} "
                          f"tasks, not {quota} ({tally.line(mutants.project.name, quota, 0)}): lower --n or add "
                          "sources")
    return kept[:quota]


def judge_candidates(mutants: Candidates, quota: int, opts: Options, progress: Callable[[str], None] = lambda s: None,
                     environment: RequirementsImage | None = None
                     ) -> tuple[list[tuple[Any, Verdict, dict[str, str]]], Tally]:
    """Candidates validated in order until `quota` are kept or none is left: the kept ones (verdict, failures'
    excerpts) and the tally of all judged. SourceError when no test passes on the clean tree."""
    project = mutants.project
    work = opts.out / WORK / work_name(project, environment)
    work.mkdir(parents=True, exist_ok=True)
    spec = suite_spec(project.name, opts.timeout_s, RESOURCES, environment.image if environment else HOST_IMAGE,
                      environment.runner if environment else "unittest", project.tests)
    base = _clean(project, work, opts, spec, environment)
    # How far earlier runs got, in batches of whatever size: the first batch reaches that far, so their
    # results are judged, and only the gaps they left run, before anything further down the order
    frontier = max((i + 1 for i, c in enumerate(mutants.order) if (work / f"{c.id}.json").exists()), default=0)
    tally, start, kept = Tally(), 0, []
    while True:
        judged = _judge_upto(mutants, base, work, start)
        kept = [j for j in judged if j[1].kept]
        tally = Tally(start, len(kept), Counter(v.reason for _, v, _ in judged if not v.kept))
        if start:
            progress(tally.line(project.name, quota, len(mutants.order) - start))
        if len(kept) >= quota or start >= len(mutants.order):
            break
        # Enough for the tasks still wanted if half are kept, and every sandbox busy; the kept set is the
        # same whatever the batches (each verdict is its own candidate's).
        width = opts.parallelism if opts.slurm else opts.jobs
        end = frontier if frontier > start else start + min(MAX_BATCH, max(2 * width, 2 * (quota - len(kept))))
        chunk = mutants.order[start:end]
        # A mutant that would be kept runs once more: a failing set that changes is flakiness the clean runs missed.
        todo = [Job(work / f"{c.id}.json", mutants.diff(c), again=lambda r: judge(base, r).kept) for c in chunk
                if read_result(work / f"{c.id}.json") is None]
        _run(project, work, opts, spec, todo, workers=opts.jobs)
        start += len(chunk)
    return kept[:quota], tally


def _judge_upto(mutants: Candidates, base: Baseline, work: Path, end: int
                ) -> list[tuple[Any, Verdict, dict[str, str]]]:
    """Verdicts of candidates [0, end) in order, duplicates decided in that order (pure over result files)."""
    rows = []
    for c in mutants.order[:end]:
        runs = read_result(work / f"{c.id}.json")
        if runs is None:
            raise SourceError(f"{work / (c.id + '.json')}: missing while later results exist: run again")
        verdict = judge(base, runs[0], runs[1] if len(runs) > 1 else None)
        rows.append((c, verdict, runs[0].failures))
    verdicts = dedupe([(v, mutants.diff(c) if v.kept else b"", mutants.place(c)) for c, v, _ in rows])
    return [(c, v, f) for (c, _, f), v in zip(rows, verdicts, strict=True)]


def generate(opts: Options, progress: Callable[[str], None] = lambda s: None) -> list[Path]:
    """Validate and write the tasks; a task already written with the same bytes is left as it is."""
    if opts.out.exists() and not opts.out.is_dir():
        raise Refused(f"--out {opts.out} is not a directory: name a directory (it is created if missing)")
    projects = [load(s, opts.find_links) for s in opts.sources]
    base = opts.base_image or DEFAULT_BASE
    environments: list[RequirementsImage | None] = []
    for project, reqs in zip(projects, opts.requirements or [()] * len(projects), strict=True):
        if reqs:
            progress(f"{project.name}: fetching the wheels of {', '.join(reqs)}")
        environments.append(fetch(reqs, base, opts.find_links, project) if reqs else None)
    require_images([(p, e) for p, e in zip(projects, environments, strict=True) if e is not None],
                   opts.image_cache, opts.out / WORK / IMAGE_BUILDS)
    quotas = [opts.n // len(projects) + (i < opts.n % len(projects)) for i in range(len(projects))]
    tasks: list[tuple[str, dict[str, bytes]]] = []
    for project, environment, quota in zip(projects, environments, quotas, strict=True):
        if quota:
            mutants = Mutants(project, opts.split, opts.seed, opts.hints)
            for c, v, failures in validate(mutants, quota, opts, progress, environment):
                runner = environment.runner if environment else "unittest"
                d = issue.draft(project, c.key, c.path, mutants.mutated(c), c.site, v.fail_to_pass, v.pass_to_pass,
                                failures, opts.hints, runner)
                inverse = unified_diff(c.path, mutants.mutated(c), project.files[c.path].decode())
                name = task_name(FAMILY, opts.split, opts.seed, len(tasks))
                files = layout(name, d, FAMILY, opts.split, opts.seed, issue.solve_sh(inverse), suite=project.tests,
                               environment=environment.context() if environment else None, runner=runner)
                tasks.append((name, files))
    return write_tasks(opts, tasks)


def write_tasks(opts: Options, tasks: list[tuple[str, dict[str, bytes]]]) -> list[Path]:
    """Each task written under --out; one already there with the same bytes is left as it is."""
    written = []
    for name, files in tasks:
        target = opts.out / name
        if occupied(target) and not opts.force:
            if _same(target, files):
                written.append(target)
                continue
            raise Refused(f"{target} exists and differs from what this run makes: pass --force to replace it, "
                          "or choose another --out")
        written.append(write_task(opts.out, name, files, opts.force))
    return written


def _same(target: Path, files: dict[str, bytes]) -> bool:
    have = {p.relative_to(target).as_posix(): p for p in target.rglob("*") if p.is_file()}
    return set(have) == set(files) and all(have[rel].read_bytes() == data for rel, data in files.items())
