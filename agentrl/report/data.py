"""What a run report shows, shaped from the run directory's files.

Everything here but `read_run` is pure: parsed records in, plain series and rows out. A series is
(xs, ys), x being the rollout (training metrics) or the checkpoint iteration (eval results). Input
that does not fit is counted and described for the reader of the report, never raised.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard

from hpc.records import RecordError
from hpc.runlayout import EvalLayout, RunLayout

Series = tuple[list[int], list[float]]

NO_METRICS = "no training metrics yet"
NO_EVALS = "no eval results yet"

# The "latest values" table, in this order; pass@<k> keys join after reward_mean.
LATEST_KEYS = (
    "reward_mean", "empty_patch_rate", "zero_variance_groups", "samples_per_attempt", "infra_failures",
    "metric_input_errors", "attempts", "samples", "response_tokens", "trained_tokens", "attempts_per_hour",
    "trained_tokens_per_s", "time/boot_s_mean", "time/agent_s_mean", "time/grade_s_mean", "rollout_s",
    "wait_s", "train_s", "checkpoint_s", "publish_s", "train/loss", "train/clipfrac", "train/approx_kl",
    "train/grad_norm", "train/mismatch_mean", "train/mismatch_max", "weight_version", "staleness/mean",
    "staleness/max", "staleness/masked_tokens",
)
_PASS_KEY = re.compile(r"^pass@(\d+)$")
_EVAL_DIR = re.compile(r"^iter_(0|[1-9][0-9]*)$")   # as RunLayout.eval_dir names them


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---------------------------------------------------------------- metrics.jsonl


@dataclass(frozen=True)
class MetricLog:
    records: list[dict[str, Any]]      # one per rollout, by rollout
    unreadable: list[int]              # line numbers (from 1): not JSON, not an object, or no kind/rollout
    rerecorded: list[int]              # rollouts with several lines; the last one is kept


def parse_metrics(text: str) -> MetricLog:
    """The trainer's lines of metrics.jsonl. Lines of other kinds belong to other readers and are left out."""
    by_rollout: dict[int, dict[str, Any]] = {}
    unreadable: list[int] = []
    rerecorded: set[int] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            unreadable.append(number)
            continue
        if not isinstance(record, dict) or "kind" not in record:
            unreadable.append(number)
            continue
        if record["kind"] != "train":
            continue
        rollout = record.get("rollout")
        if not (isinstance(rollout, int) and not isinstance(rollout, bool) and rollout >= 0):
            unreadable.append(number)
            continue
        # A trainer resumed from a checkpoint older than its last line trains that rollout again;
        # the later line describes the weights the run went on with.
        if rollout in by_rollout:
            rerecorded.add(rollout)
        by_rollout[rollout] = record
    return MetricLog([by_rollout[r] for r in sorted(by_rollout)], unreadable, sorted(rerecorded))


def series(records: list[dict[str, Any]], key: str) -> Series:
    """key's numeric values against their rollouts; rollouts without one (e.g. no publish) are left out."""
    points = [(r["rollout"], r[key]) for r in records if is_number(r.get(key))]
    return [x for x, _ in points], [float(y) for _, y in points]


def collect(records: list[dict[str, Any]], keys: list[str] | tuple[str, ...]) -> dict[str, Series]:
    """The series of those keys that some rollout recorded."""
    found = {key: series(records, key) for key in keys}
    return {key: s for key, s in found.items() if s[0]}


def pass_keys(records: list[dict[str, Any]]) -> list[str]:
    """pass@1, pass@<n_samples_per_prompt>, ...: whichever k the trainer reported, by k."""
    keys = {k for r in records for k in r if _PASS_KEY.match(k)}
    return sorted(keys, key=lambda k: int(k.split("@")[1]))


def class_counts(records: list[dict[str, Any]], prefix: str, *, counted_by: str | None = None,
                 exclude: tuple[str, ...] = (), order: tuple[str, ...] = ()) -> dict[str, Series]:
    """Counts of each `<prefix><class>` key, as aligned series for stacking: classes in `order` first.

    rollout_report writes only the classes it saw, so a rollout that counted classes (it has
    `counted_by`, or any class key) but lacks one saw none of it: 0, not a gap.
    """
    def counted(r: dict[str, Any]) -> bool:
        return (counted_by is not None and counted_by in r) or any(k.startswith(prefix) for k in r)

    rows = [r for r in records if counted(r)]
    found = {k[len(prefix):] for r in rows for k in r if k.startswith(prefix)} - set(exclude)
    classes = [c for c in order if c in found] + sorted(found - set(order))
    xs = [r["rollout"] for r in rows]
    return {c: (xs, [float(v) if is_number(v := r.get(prefix + c)) else 0.0 for r in rows]) for c in classes}


def latest_values(records: list[dict[str, Any]]) -> list[tuple[str, float, int]]:
    """(key, value, rollout) for each reported key, from the last rollout that recorded it."""
    keys = list(LATEST_KEYS)
    keys[1:1] = pass_keys(records)
    out = []
    for key in keys:
        xs, ys = series(records, key)
        if xs:
            out.append((key, ys[-1], int(xs[-1])))
    return out


# ---------------------------------------------------------------- plots as data


@dataclass(frozen=True)
class Panel:
    ylabel: str
    series: dict[str, Series]
    kind: Literal["lines", "stacked_bars"] = "lines"


@dataclass(frozen=True)
class Plot:
    name: str                        # file stem of its PNG
    title: str
    panels: tuple[Panel, ...]        # only panels with data
    xlabel: str = "rollout"
    skipped: str | None = None       # why there is nothing to draw


def plot(name: str, title: str, panels: list[Panel], missing: str, xlabel: str = "rollout") -> Plot:
    kept = tuple(p for p in panels if p.series)
    return Plot(name, title, kept, xlabel, None if kept else missing)


def training_plots(records: list[dict[str, Any]]) -> list[Plot]:
    def missing(what: str) -> str:
        return f"no rollout recorded {what}" if records else NO_METRICS

    timing_keys = ("rollout_s", "wait_s", "train_s", "checkpoint_s", "publish_s")
    attempt_keys = ("time/boot_s_mean", "time/agent_s_mean", "time/grade_s_mean")
    return [
        plot("reward", "Training reward and pass rates",
             [Panel("reward / pass rate", collect(records, ["reward_mean", *pass_keys(records)]))],
             missing("reward_mean or pass@k")),
        plot("empty_patch", "Empty patches",
             [Panel("empty-patch rate", collect(records, ["empty_patch_rate"])),
              Panel("attempts", class_counts(records, "empty_patch/", counted_by="empty_patch_rate"),
                    "stacked_bars")],
             missing("empty_patch_rate")),
        # A root turn starts each trajectory: its count is the number of trajectories, not drift.
        plot("drift", "Trajectory drift (turns by how they continued the trajectory)",
             [Panel("turns", class_counts(records, "drift/", exclude=("root",), order=("clean", "realign", "fork")),
                    "stacked_bars")],
             missing("drift counts (drift/clean, drift/realign, drift/fork)")),
        plot("samples_per_attempt", "Samples per attempt (trajectory fan-out)",
             [Panel("samples / attempt", collect(records, ["samples_per_attempt"]))],
             missing("samples_per_attempt")),
        plot("timings", "Rollout timings",
             [Panel("seconds per rollout", collect(records, timing_keys)),
              Panel("seconds per attempt (mean)", collect(records, attempt_keys))],
             missing("timings")),
        plot("throughput", "Throughput",
             [Panel("attempts / hour", collect(records, ["attempts_per_hour"])),
              Panel("trained tokens / s", collect(records, ["trained_tokens_per_s"]))],
             missing("attempts_per_hour or trained_tokens_per_s")),
        plot("infra_failures", "Infrastructure failures",
             [Panel("failed attempts", collect(records, ["infra_failures"]), "stacked_bars")],
             missing("infra_failures")),
        plot("policy_update", "Policy update",
             [Panel("loss", collect(records, ["train/loss", "train/pg_loss"])),
              Panel("clipfrac / approx KL", collect(records, ["train/clipfrac", "train/approx_kl"])),
              Panel("grad norm", collect(records, ["train/grad_norm"]))],
             missing("train/* metrics")),
        # agentrl/train/mismatch.py: what the trainer's log-probs say of the sampled tokens against the sampler's
        plot("mismatch", "Sampler and trainer",
             [Panel("|log p_train - log p_rollout|", collect(records, ["train/mismatch_mean", "train/mismatch_max"])),
              Panel("k3 KL(rollout || train)", collect(records, ["train/mismatch_k3"])),
              Panel("share of tokens off by over 0.5 (mismatch.OVER)", collect(records, ["train/mismatch_over"]))],
             missing("train/mismatch_* metrics (a run before they were recorded)")),
    ]


# ---------------------------------------------------------------- eval/iter_<n>/summary.json


def eval_pass_at_k(summary: dict[str, Any]) -> tuple[str, Any]:
    """(label, value) of the summary's pass@k: stored as `pass@<k>` or as `pass@k` beside `k`."""
    k = summary.get("k")
    if is_number(k) and f"pass@{k}" in summary:
        return f"pass@{k}", summary[f"pass@{k}"]
    return (f"pass@{k}" if is_number(k) else "pass@k"), summary.get("pass@k")


def eval_plot(summaries: list[dict[str, Any]]) -> Plot:
    points: dict[str, dict[int, float]] = {}     # label -> iteration -> rate; k = 1 names pass@1 twice
    for s in summaries:
        for label, value in (("pass@1", s.get("pass@1")), eval_pass_at_k(s)):
            if is_number(value):
                points.setdefault(label, {})[s["iteration"]] = float(value)
    rates = {label: (list(by_iter), list(by_iter.values())) for label, by_iter in points.items()}
    return plot("eval", "Eval pass rates per checkpoint", [Panel("pass rate", rates)],
                NO_EVALS, xlabel="checkpoint (rollouts trained)")


def control_plot(run: RunData, control: RunData) -> Plot:
    """The run beside its control (the same run, rewards shuffled): training reward and eval pass@1."""
    def rewards(r: RunData) -> dict[str, Series]:
        return collect(r.metrics.records if r.metrics else [], ["reward_mean"])

    def passes(r: RunData) -> Series:
        points = sorted((s["iteration"], float(s["pass@1"])) for s in r.evals if is_number(s.get("pass@1")))
        return [x for x, _ in points], [y for _, y in points]

    reward = {f"{name}: reward_mean": xy for name, r in (("run", run), ("control", control))
              for xy in rewards(r).values()}
    evals = {f"{name}: pass@1": xy for name, r in (("run", run), ("control", control)) if (xy := passes(r))[0]}
    return Plot("control", "Against the control (rewards shuffled within each group)",
                tuple(p for p in (Panel("training reward", reward), Panel("eval pass@1", evals)) if p.series),
                "checkpoint / rollout", None if reward or evals else "neither run has metrics or evals yet")


def read_eval_summaries(eval_root: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The readable summaries by iteration (each with `iteration`), and what was wrong with the others."""
    summaries, problems = [], []
    dirs = sorted((int(m.group(1)), d) for d in (eval_root.iterdir() if eval_root.is_dir() else ())
                  if (m := _EVAL_DIR.match(d.name)) and d.is_dir())
    for iteration, d in dirs:
        path = EvalLayout(d).summary_path
        try:
            summary = json.loads(path.read_text())
        except FileNotFoundError:
            problems.append(f"eval/{d.name} has no summary.json yet")
            continue
        except (OSError, ValueError) as e:
            problems.append(f"eval/{d.name}/summary.json could not be read ({e})")
            continue
        if not isinstance(summary, dict):
            problems.append(f"eval/{d.name}/summary.json holds no JSON object")
            continue
        # The directory names the checkpoint it evaluated; a summary that disagrees is noted, not trusted.
        if summary.get("iteration", iteration) != iteration:
            problems.append(f"eval/{d.name}/summary.json says iteration {summary['iteration']!r}; "
                            f"shown as {iteration}")
        summaries.append({**summary, "iteration": iteration})
    return summaries, problems


# ---------------------------------------------------------------- run.yaml


def config_summary(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The settings a person asks about first; harness, model and batch are always listed."""
    def section(name: str) -> dict[str, Any]:
        value = config.get(name)
        return value if isinstance(value, dict) else {}

    train, pool, inference, launch = (section(n) for n in ("train", "pool", "inference", "launch"))
    unset = "not in run.yaml"
    prompts, attempts = train.get("rollout_batch_size"), train.get("n_samples_per_prompt")
    if is_number(prompts) and is_number(attempts):
        batch = f"{prompts} prompts × {attempts} attempts = {prompts * attempts} attempts per rollout"
    else:
        batch = unset
    rows = [("harness", str(pool.get("harness", unset))), ("model", str(train.get("model", unset))),
            ("batch", batch)]
    step = train.get("global_batch_size")
    if is_number(step) and is_number(prompts) and is_number(attempts):
        rows.append(("optimizer step", f"{step} attempts ({prompts * attempts // step} steps per rollout)"))
    elif "rollout_batch_size" in train:
        rows.append(("optimizer step", "all of a rollout's attempts (one step per rollout)"))
    optional = [("rollouts planned", train.get("num_rollouts")), ("learning rate", train.get("lr")),
                ("trainer backend", train.get("backend")), ("inference engine", inference.get("engine")),
                ("launch", launch.get("name"))]
    rows += [(name, str(value)) for name, value in optional if value is not None]
    return rows


# ---------------------------------------------------------------- the run directory (reads files)


@dataclass(frozen=True)
class RunData:
    root: Path
    run_id: str
    created: float
    config: dict[str, Any]
    latest_checkpoint: int | None
    metrics: MetricLog | None                   # None: no metrics.jsonl
    evals: list[dict[str, Any]]
    problems: list[str] = field(default_factory=list)   # files that could not be used, for the report


def read_run(root: Path | str) -> RunData:
    """Raises RunDirError or RecordError when root is not a readable run directory; copes with the rest."""
    run = RunLayout.open(root)
    manifest = run.manifest()
    problems: list[str] = []
    try:
        latest = run.latest_checkpoint()
    except RecordError as e:
        latest = None
        problems.append(str(e))
    try:
        metrics: MetricLog | None = parse_metrics(run.metrics_path.read_text(errors="replace"))
    except FileNotFoundError:
        metrics = None
    evals, eval_problems = read_eval_summaries(run.evals_dir)
    return RunData(run.root, manifest.run_id, manifest.created, manifest.config, latest, metrics, evals,
                   problems + eval_problems)
