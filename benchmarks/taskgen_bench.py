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
fraction, refusals and spread, and checks that the two runs made the same tasks byte for byte.
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
    f2p, lines = [], []
    for task in sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if project is not None and f'project = "{project}"' not in (task / "task.toml").read_text():
            continue
        f2p.append(len(json.loads((task / "tests" / "expected.json").read_text())["FAIL_TO_PASS"]))
        patch = (task / "solution" / "solve.sh").read_text()
        lines.append(sum(1 for line in patch.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")))
    return {"tasks": len(f2p), "fail_to_pass": summary(f2p), "fix_lines": summary(lines)}


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
    lines = [f"{'project':24s} {'built':>6s} {'kept':>5s} {'kept %':>7s} {'tasks':>6s}  refused; FAIL_TO_PASS and fix "
             "lines per task (min/median/max)"]
    for p in r["projects"]:
        f, x = p["fail_to_pass"], p["fix_lines"]
        lines.append(f"{p['project'][:24]:24s} {p['built']:6d} {p['kept']:5d} {p['kept_fraction']:7.0%} "
                     f"{p['tasks']:6d}  {p['refused'] or 'none'}; {f['min']}/{f['median']}/{f['max']}; "
                     f"{x['min']}/{x['median']}/{x['max']}")
    lines.append(f"{r['tasks']} tasks in {r['wall_s'][0]:.0f} s ({r['mode']}): {r['candidates_per_h']} candidates/h, "
                 f"{r['tasks_per_h']} tasks/h; made again from scratch in {r['wall_s'][1]:.0f} s "
                 f"(ratio {r['wall_s'][1] / r['wall_s'][0]:.2f}): the same tasks byte for byte: "
                 f"{r['same_tasks_twice']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="taskgen_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", action="append", help="a project (repeatable; default: listkit and more-itertools)")
    p.add_argument("--n", type=int, default=6, help="tasks per source (default 6)")
    p.add_argument("--modes", default="local:1,local:2", help="comma-separated local:J and slurm:P "
                   "(default local:1,local:2; slurm modes need SLURM_CONF and --work on a filesystem the nodes share)")
    p.add_argument("--work", type=Path, help="where the tasks go (default: a temporary directory, removed)")
    p.add_argument("--one-set", action="store_true", help="the sources as one data set, --n from each, made twice "
                   "(default sources: six real projects, SET)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        modes = [parse_mode(m) for m in args.modes.split(",")]
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    if args.n < 1:
        p.error(f"--n must be at least 1, got {args.n}")
    work = args.work or Path(tempfile.mkdtemp(prefix="agentrl-taskgen-"))
    if args.one_set:
        report = one_set(args.source or SET, args.n, modes[0], work)
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
