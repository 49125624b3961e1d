"""Tasks from real projects: what validation keeps, what it costs, and how it scales on Slurm.

For each --source, `agentrl tasks generate mutations` makes --n train tasks from scratch (a fresh --out)
in each --mode, one after another:
    local:J    J bwrap sandboxes on this machine (--jobs J)
    slurm:P    job arrays on the cluster SLURM_CONF names, at most P tasks at once (--slurm --parallelism P)
and prints, per source and mode, the wall time, the candidates validated and the tasks kept per hour;

    figure:   each mode's candidates validated per hour
    baseline: the first mode's (default local:1, one sandbox)
    ratio = figure / baseline

then, from the tasks of the first mode (every mode makes the same tasks byte for byte, which is checked):
the kept fraction of the candidates, the refusal reasons, and the difficulty spread (FAIL_TO_PASS
tests per task, lines the fix changes).

    python -m benchmarks.taskgen_bench [--source SPEC ...] [--n 6] [--modes local:1,local:2,slurm:3]
                                       [--work DIR] [--json]

Default sources: tests/data/mutations/listkit (vendored) and more-itertools 10.5.0 (from the index).

With --one-set, the sources (default: SET, six real projects from the index) make one data set with one
command, --n tasks from each, in the first mode, twice from scratch: it prints each project's kept
fraction, refusals, spread and test layout (where its tests live), and checks that the two runs made the
same tasks byte for byte. --layouts makes that set from LAYOUTS, real projects whose tests are not in tests/.

With --history NAME==V1,V2,..., the releases' sdists (from the index) are committed in order into a git
repository, one commit each (or --history CHECKOUT: a git checkout's own history), and `agentrl tasks
generate commits` makes train tasks from that history in the first mode, trying every candidate: it
prints the commits, the candidates, the kept and why the rest were not, tasks per hour, checks each kept
task (oracle 1, no-op 0), and runs the scripted teacher on the kept commits made with --hints fix (its
pass rate, and whether it passed exactly its right draws).
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [str(ROOT / "tests/data/mutations/listkit"), "more-itertools==10.5.0"]
# Six real projects of different shapes whose unittest suites run in seconds (docs/tasks.md)
SET = ["more-itertools==10.5.0", "cachetools==5.5.0", "pycparser==2.22", "idna==3.10", "markdown==3.7",
       "pyasn1==0.6.1"]
# Real projects whose tests live elsewhere than tests/ (docs/tasks.md, "Where the tests are")
# (PKG/test, PKG/tests twice, src/PKG/*/tests, test/; ply 3.11's test/ modules run unittest.main() on import)
LAYOUTS = ["pyflakes==3.2.0", "pytz==2024.2", "simplejson==3.19.3", "zope.interface==7.1.1", "pyelftools==0.31"]
TALLY = re.compile(r"^(?P<name>\S+): built (?P<built>\d+), kept (?P<kept>\d+) \(\d+ wanted\), "
                   r"refused \d+ \((?P<reasons>[^)]*)\)", re.MULTILINE)


def parse_mode(text: str) -> tuple[str, int]:
    kind, _, width = text.partition(":")
    if kind not in ("local", "slurm") or not width.isdigit() or int(width) < 1:
        raise argparse.ArgumentTypeError(f"a mode is local:J or slurm:P with a whole number >= 1, got {text!r}")
    return kind, int(width)


def generate(sources: list[str], n: int, mode: tuple[str, int], out: Path) -> dict:
    """Tasks made from scratch in one mode, `n` from the sources together: the wall time and, per project,
    its last progress line's counts."""
    kind, width = mode
    args = [sys.executable, "-m", "agentrl.cli", "tasks", "generate", "mutations", *(
        a for source in sources for a in ("--source", source)), "--n", str(n),
            "--split", "train", "--seed", "0", "--out", str(out)]
    args += ["--jobs", str(width)] if kind == "local" else ["--slurm", "--parallelism", str(width)]
    t0 = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "AGENTRL_PYTHON": sys.executable})   # the array tasks' Python
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"taskgen_bench: {' '.join(args)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    last = {m["name"]: m for m in TALLY.finditer(r.stderr)}
    if len(last) != len(sources):
        raise SystemExit(f"taskgen_bench: {len(last)} projects' progress lines, not {len(sources)}, in the output "
                         f"of {' '.join(args)}:\n{r.stderr[-2000:]}")
    projects = {name: {"built": int(m["built"]), "kept": int(m["kept"]), "refused": {
        k: int(v) for k, v in (part.rsplit(" ", 1) for part in m["reasons"].split(", ") if part != "none")}}
        for name, m in last.items()}
    return {"wall_s": round(wall, 1), "projects": projects}


def spread(out: Path, project: str | None = None) -> dict:
    """FAIL_TO_PASS tests per task and the lines each fix changes (of `project`'s tasks, or all)."""
    f2p, lines, layout = [], [], ""
    for task in sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if project is not None and f'project = "{project}"' not in (task / "task.toml").read_text():
            continue
        expected = json.loads((task / "tests" / "expected.json").read_text())
        f2p.append(len(expected["FAIL_TO_PASS"]))
        layout = " ".join(expected.get("test_dirs", ["tests"]))
        patch = (task / "solution" / "solve.sh").read_text()
        lines.append(sum(1 for line in patch.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")))
    return {"tasks": len(f2p), "fail_to_pass": summary(f2p), "fix_lines": summary(lines), "layout": layout}


def summary(xs: list[int]) -> dict:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)} if xs else {}


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".mutations" not in p.parts}


def one_set(sources: list[str], n: int, mode: tuple[str, int], work: Path) -> dict:
    """One command's data set from every source, made twice from scratch: per project, what validation kept
    and refused and the tasks' spread; and whether the two runs made the same tasks byte for byte."""
    runs = []
    for i in (1, 2):
        out = work / f"set-{i}"
        shutil.rmtree(out, ignore_errors=True)
        runs.append((out, generate(sources, n * len(sources), mode, out)))
    (first, made), (second, again) = runs
    projects = []
    for name, counts in made["projects"].items():
        projects.append({"project": name, **counts, "kept_fraction": round(counts["kept"] / counts["built"], 3),
                         **spread(first, name)})
    tasks = sum(p["tasks"] for p in projects)
    return {"benchmark": "taskgen-set", "mode": f"{mode[0]}:{mode[1]}", "sources": sources, "n_per_source": n,
            "tasks": tasks, "wall_s": [made["wall_s"], again["wall_s"]],
            "candidates_per_h": round(sum(p["built"] for p in projects) / made["wall_s"] * 3600),
            "tasks_per_h": round(tasks / made["wall_s"] * 3600),
            "same_tasks_twice": tree(first) == tree(second), "projects": projects}


def format_set(r: dict) -> str:
    lines = [f"{'project':24s} {'built':>6s} {'kept':>5s} {'kept %':>7s} {'tasks':>6s}  test directories; refused; "
             "FAIL_TO_PASS and fix lines per task (min/median/max)"]
    for p in r["projects"]:
        f, x = p["fail_to_pass"], p["fix_lines"]
        lines.append(f"{p['project'][:24]:24s} {p['built']:6d} {p['kept']:5d} {p['kept_fraction']:7.0%} "
                     f"{p['tasks']:6d}  {p['layout']}; {p['refused'] or 'none'}; {f['min']}/{f['median']}/{f['max']}; "
                     f"{x['min']}/{x['median']}/{x['max']}")
    lines.append(f"{r['tasks']} tasks in {r['wall_s'][0]:.0f} s ({r['mode']}): {r['candidates_per_h']} candidates/h, "
                 f"{r['tasks_per_h']} tasks/h; made again from scratch in {r['wall_s'][1]:.0f} s "
                 f"(ratio {r['wall_s'][1] / r['wall_s'][0]:.2f}): the same tasks byte for byte: "
                 f"{r['same_tasks_twice']}")
    return "\n".join(lines)


COMMITS_READ = re.compile(r"^(?P<name>\S+): (?P<commits>\d+) commits, (?P<candidates>\d+) candidates, "
                          r"(?P<split>\d+) of them train; not candidates: (?P<skipped>.*)$", re.MULTILINE)
COMMITS_TALLY = re.compile(r"^\S+: tried (?P<tried>\d+) of \d+, kept (?P<kept>\d+) \(\d+ wanted\), refused \d+ "
                           r"\((?P<reasons>[^)]*)\)$", re.MULTILINE)


def counts(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (part.rsplit(" ", 1) for part in text.split(", ") if part != "none")}


def release_history(spec: str, repo: Path) -> int:
    """NAME==V1,V2,...: each release's sdist committed in order into a new git repository at `repo`."""
    from agentrl.swe.mutate.project import from_requirement

    name, _, versions = spec.partition("==")
    if not name or not versions:
        raise SystemExit(f"taskgen_bench: --history NAME==V1,V2,..., got {spec!r}")
    env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.com",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    for version in versions.split(","):
        project = from_requirement(f"{name}=={version}")
        for old in [p for p in repo.iterdir() if p.name != ".git"]:
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        for rel, data in project.files.items():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_bytes(data)
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
        subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", f"{name} {version}"],
                       check=True, env=env)
        print(f"  {name} {version}: {len(project.files)} files", flush=True)
    return len(versions.split(","))


def history(spec: str, mode: tuple[str, int], work: Path) -> dict:
    """Train tasks from a history of releases: every candidate tried (an --n past what it holds), then the kept
    ones written (their results reused) and checked."""
    if Path(spec).is_dir():         # a checkout with a history of its own
        repo, releases = Path(spec), None
    else:
        repo = work / "history"
        releases = release_history(spec, repo)
    base = [sys.executable, "-m", "agentrl.cli", "tasks", "generate", "commits", "--source", str(repo), "--split",
            "train", "--seed", "0", "--out", str(work / "history-tasks"), "--jobs", str(mode[1])]
    t0 = time.monotonic()
    r = subprocess.run([*base, "--n", "100000"], capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    read, tallies = COMMITS_READ.search(r.stderr), list(COMMITS_TALLY.finditer(r.stderr))
    if read is None or not tallies:
        raise SystemExit(f"taskgen_bench: {' '.join(base)} printed no progress:\n{r.stderr[-2000:]}")
    last = tallies[-1]
    kept = int(last["kept"])
    report = {"benchmark": "taskgen-history", "history": spec, "releases": releases, "commits": int(read["commits"]),
              "candidates": int(read["candidates"]), "train_candidates": int(read["split"]),
              "not_candidates": counts(read["skipped"]), "tried": int(last["tried"]), "kept": kept,
              "refused": counts(last["reasons"]), "wall_s": round(wall, 1),
              "tasks_per_h": round(kept / wall * 3600, 1), "candidates_per_h": round(int(last["tried"]) / wall * 3600)}
    if kept:
        made = subprocess.run([*base, "--n", str(kept)], capture_output=True, text=True, cwd=ROOT)
        if made.returncode != 0:
            raise SystemExit(f"taskgen_bench: writing the {kept} kept tasks failed:\n{made.stderr[-2000:]}")
        checked = subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "check", str(work / "history-tasks"),
                                  "--json"], capture_output=True, text=True, cwd=ROOT)
        tasks = json.loads(checked.stdout.strip().splitlines()[-1])["tasks"]
        report["oracle_1_noop_0"] = sum(t["oracle_reward"] == 1.0 and t["noop_reward"] == 0.0 for t in tasks)
        report.update(spread(work / "history-tasks"))
        report["teacher"] = teacher_on(base, kept, work)
    return report


def teacher_on(base: list[str], kept: int, work: Path, accuracy: float = 0.5, attempts: int = 2) -> dict:
    """The kept commits made again with --hints fix (their validation's result files reused), then the
    scripted teacher on them through `agentrl eval` (builtin agent, bwrap): its pass rate, and whether it
    passed exactly the attempts it drew right."""
    from agentrl.eval.score import attempt_seed
    from agentrl.models.tiny import make_tiny_model
    from agentrl.swe.teacher import Teacher

    hinted = work / "history-hints"
    shutil.rmtree(hinted, ignore_errors=True)
    hinted.mkdir(parents=True)
    shutil.copytree(work / "history-tasks" / ".mutations", hinted / ".mutations")
    args = [*base[:base.index("--out")], "--out", str(hinted), *base[base.index("--out") + 2:]]
    made = subprocess.run([*args, "--n", str(kept), "--hints", "fix"], capture_output=True, text=True, cwd=ROOT)
    if made.returncode != 0:
        raise SystemExit(f"taskgen_bench: the kept commits with --hints fix:\n{made.stderr[-2000:]}")
    pool = {"harness": "builtin", "prompt_style": "instruction", "max_agents": 2, "max_booting": 2, "lease_s": 120,
            # an instruction carries a release's patch: tens of kB
            "adapter": {"max_new_tokens": 256, "max_context": 131072}}
    config = work / "teacher.yaml"
    config.write_text(json.dumps({"eval": {"tasks": str(hinted), "n_samples": attempts, "seed": 0,
                                           "engine": "teacher", "teacher_accuracy": accuracy, "pool": pool}}))
    model = make_tiny_model(work / "tiny-model")
    out = work / "teacher-eval"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", str(model), "--config", str(config), "--out",
                        str(out)], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"taskgen_bench: the teacher's eval failed:\n{r.stderr[-2000:]}")
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    teacher = Teacher(accuracy, seed=0)
    right = [teacher.mistake(attempt_seed(0, x["task"], x["attempt"])) is None for x in results]
    passed = [x["reward"] == 1.0 for x in results]
    return {"accuracy": accuracy, "attempts": len(results), "passed": sum(passed),
            "pass_at_1": round(sum(passed) / len(results), 3), "right_plans": sum(right),
            "right_passed": sum(p and ok for p, ok in zip(passed, right, strict=True)),
            "mistakes_failed": sum(not p and not ok for p, ok in zip(passed, right, strict=True)),
            "wall_s": round(time.monotonic() - t0, 1)}


def format_history(r: dict) -> str:
    what = (f"{r['history'].split('==')[0]}: {r['releases']} releases committed in order" if r["releases"]
            else f"{r['history']}: its own history")
    return (f"{what}; {r['commits']} commits, "
            f"{r['candidates']} candidates ({r['train_candidates']} train); not candidates: {r['not_candidates']}\n"
            f"tried {r['tried']}, kept {r['kept']}, refused {r['refused']}; in {r['wall_s']:.0f} s: "
            f"{r['candidates_per_h']} candidates/h, {r['tasks_per_h']} tasks/h"
            + (f"\nkept tasks through tasks check: {r['oracle_1_noop_0']} of {r['kept']} oracle 1 and no-op 0; "
               f"FAIL_TO_PASS per task {r['fail_to_pass']}; lines the fix changes {r['fix_lines']}"
               if r["kept"] else "")
            + (f"\nthe scripted teacher (accuracy {t['accuracy']}) with --hints fix: pass@1 {t['pass_at_1']} "
               f"({t['passed']} of {t['attempts']}); right plans passed {t['right_passed']} of {t['right_plans']}, "
               f"mistakes failed {t['mistakes_failed']} of {t['attempts'] - t['right_plans']}; {t['wall_s']:.0f} s"
               if (t := r.get("teacher")) else ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="taskgen_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", action="append", help="a project (repeatable; default: listkit and more-itertools)")
    p.add_argument("--n", type=int, default=6, help="tasks per source (default 6)")
    p.add_argument("--modes", default="local:1,local:2", help="comma-separated local:J and slurm:P "
                   "(default local:1,local:2; slurm modes need SLURM_CONF and --work on a filesystem the nodes share)")
    p.add_argument("--work", type=Path, help="where the tasks go (default: a temporary directory, removed)")
    p.add_argument("--one-set", action="store_true", help="the sources as one data set, --n from each, made twice "
                   "(default sources: six real projects, SET)")
    p.add_argument("--layouts", action="store_true", help="--one-set from LAYOUTS, projects whose tests are not "
                   "in tests/")
    p.add_argument("--history", metavar="NAME==V1,V2,...", help="tasks from a history of these releases, committed "
                   "in order, or from a git checkout's own history (the commits family)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        modes = [parse_mode(m) for m in args.modes.split(",")]
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    if args.n < 1:
        p.error(f"--n must be at least 1, got {args.n}")
    work = args.work or Path(tempfile.mkdtemp(prefix="agentrl-taskgen-"))
    if args.history:
        report = history(args.history, modes[0], work)
        print(json.dumps(report) if args.json else format_history(report))
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    if args.layouts and (args.source or args.history):
        p.error("--layouts is a set of its own (LAYOUTS): leave out --source and --history")
    if args.one_set or args.layouts:
        report = one_set(args.source or (LAYOUTS if args.layouts else SET), args.n, modes[0], work)
        print(json.dumps(report) if args.json else format_set(report))
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    rows: list[dict] = []
    for source in args.source or SOURCES:
        outs = {}
        for mode in modes:
            out = work / f"{len(rows)}-{mode[0]}{mode[1]}"
            shutil.rmtree(out, ignore_errors=True)
            made = generate([source], args.n, mode, out)
            [counts] = made["projects"].values()
            row = {"source": source, "mode": f"{mode[0]}:{mode[1]}", "wall_s": made["wall_s"], **counts}
            row["candidates_per_h"] = round(row["built"] / row["wall_s"] * 3600)
            row["tasks_per_h"] = round(args.n / row["wall_s"] * 3600)
            outs[row["mode"]] = out
            rows.append(row)
        first = next(iter(outs.values()))
        same = all(tree(o) == tree(first) for o in outs.values())
        rows[-len(modes)].update(spread(first), same_tasks_in_every_mode=same)
        if not same:
            raise SystemExit(f"taskgen_bench: {source}: the modes made different tasks "
                             f"({', '.join(map(str, outs.values()))})")
    base = {r["source"]: r["candidates_per_h"] for r in rows if r["mode"] == f"{modes[0][0]}:{modes[0][1]}"}
    for r in rows:
        r["ratio"] = round(r["candidates_per_h"] / base[r["source"]], 2)
    if args.json:
        print(json.dumps({"benchmark": "taskgen", "n": args.n, "rows": rows}))
    else:
        print(f"{'source':34s} {'mode':9s} {'wall s':>7s} {'built':>6s} {'kept':>5s} {'cand/h':>7s} {'tasks/h':>8s} "
              f"{'ratio':>6s}")
        for r in rows:
            print(f"{Path(r['source']).name[:34]:34s} {r['mode']:9s} {r['wall_s']:7.1f} {r['built']:6d} {r['kept']:5d} "
                  f"{r['candidates_per_h']:7d} {r['tasks_per_h']:8d} {r['ratio']:6.2f}")
        for r in rows:
            if "tasks" in r:
                print(f"{Path(r['source']).name}: kept {r['kept']} of {r['built']} candidates "
                      f"({r['kept'] / r['built']:.0%}); refused {r['refused'] or 'none'}; FAIL_TO_PASS per task "
                      f"{r['fail_to_pass']}; lines the fix changes {r['fix_lines']}; the same tasks in every mode: "
                      f"{r['same_tasks_in_every_mode']}")
        print(f"figure: candidates validated per hour; baseline: {args.modes.split(',')[0]}; ratio = figure / baseline")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
