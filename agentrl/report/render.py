"""A run's progress as report.md beside its PNG plots (`agentrl report`, agentrl/commands/report.py)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hpc.fsio import write_atomic

from .data import (
    NO_EVALS,
    Plot,
    RunData,
    config_summary,
    control_plot,
    eval_pass_at_k,
    eval_plot,
    is_number,
    latest_values,
    read_run,
    training_plots,
)

REPORT_NAME = "report.md"
SHOWN_LINE_NUMBERS = 5


def report_plots(run: RunData) -> list[Plot]:
    plots = training_plots(run.metrics.records if run.metrics else [])
    plots.insert(1, eval_plot(run.evals))        # beside the training reward it is compared with
    return plots


def write_report(run_dir: Path | str, out_dir: Path | str | None = None, control: Path | str | None = None) -> Path:
    """Write report.md and its PNGs into out_dir (default: the run directory); return report.md's path.

    Raises RunDirError or RecordError when run_dir is not a readable run directory.
    """
    # matplotlib takes a second to import: only a report pays for it, not every `agentrl` command.
    from .plots import draw, save

    run = read_run(run_dir)
    against = read_run(control) if control is not None else None
    out = Path(out_dir) if out_dir is not None else run.root
    out.mkdir(parents=True, exist_ok=True)
    plots = report_plots(run)
    if against is not None:
        plots.insert(0, control_plot(run, against))
    for plot in plots:
        png = out / f"{plot.name}.png"
        if plot.skipped:
            png.unlink(missing_ok=True)     # an earlier report's figure would contradict this report
        else:
            save(draw(plot), png)
    path = out / REPORT_NAME
    write_atomic(path, render_markdown(run, plots, against).encode())
    return path


# ---------------------------------------------------------------- markdown (pure)


def render_markdown(run: RunData, plots: list[Plot], control: RunData | None = None) -> str:
    records = run.metrics.records if run.metrics else []
    lines = [f"# Run report: {run.run_id}", "", *_header(run), ""]
    if control is not None:
        lines += ["## Against the control", "", f"The control: `{control.root}`, the same run with the rewards "
                  "shuffled within each group.", "", *_control_table(run, control), ""]
    notes = _notes(run)
    if notes:
        lines += ["## Could not be used", "", *(f"- {n}" for n in notes), ""]
    lines += ["## Config", "", *_table(["setting", "value"], [list(row) for row in config_summary(run.config)]), ""]
    lines += ["## Latest values", ""]
    if records:
        rows = [[key, _fmt(value), str(rollout)] for key, value, rollout in latest_values(records)]
        lines += _table(["metric", "value", "rollout"], rows)
    else:
        lines.append(f"_No training metrics yet: {_why_no_metrics(run)}._")
    lines += ["", "## Checkpoints (eval)", ""]
    lines += _eval_table(run) if run.evals else [f"_{NO_EVALS.capitalize()} (no eval/iter_<n>/summary.json)._"]
    lines += ["", "## Plots"]
    for plot in plots:
        lines += ["", f"### {plot.title}", ""]
        lines.append(f"_Skipped: {plot.skipped}._" if plot.skipped else f"![{plot.title}]({plot.name}.png)")
    return "\n".join(lines) + "\n"


def _header(run: RunData) -> list[str]:
    records = run.metrics.records if run.metrics else []
    latest = f"iter_{run.latest_checkpoint}" if run.latest_checkpoint is not None else "none yet"
    if records:
        first, last = records[0]["rollout"], records[-1]["rollout"]
        recorded = f"{len(records)} ({first}–{last})" if len(records) > 1 else f"1 ({first})"
        if is_number(records[-1].get("time")):
            recorded += f", the last at {_utc(records[-1]['time'])}"
    else:
        recorded = "none"
    return [f"- run directory: `{run.root}`", f"- created: {_utc(run.created)}",
            f"- latest checkpoint: {latest}", f"- rollouts recorded: {recorded}"]


def _why_no_metrics(run: RunData) -> str:
    return "metrics.jsonl does not exist" if run.metrics is None else "metrics.jsonl holds no trainer lines"


def _notes(run: RunData) -> list[str]:
    notes = []
    if run.metrics and run.metrics.unreadable:
        bad = run.metrics.unreadable
        shown = ", ".join(map(str, bad[:SHOWN_LINE_NUMBERS])) + (", …" if len(bad) > SHOWN_LINE_NUMBERS else "")
        notes.append(f"{len(bad)} metric line{'s' if len(bad) != 1 else ''} could not be read "
                     f"(metrics.jsonl line{'s' if len(bad) != 1 else ''} {shown}): not JSON, or no kind or rollout")
    if run.metrics and run.metrics.rerecorded:
        notes.append(f"rollouts {', '.join(map(str, run.metrics.rerecorded))} were recorded more than once "
                     "(a resumed trainer trained them again); the last line of each is shown")
    input_errors = sum(r["metric_input_errors"] for r in (run.metrics.records if run.metrics else [])
                       if is_number(r.get("metric_input_errors")))
    if input_errors:
        notes.append(f"{_fmt(input_errors)} metric input errors over all rollouts (samples that did not fit a "
                     "metric; the trainer's log names them)")
    return notes + run.problems


def _eval_table(run: RunData) -> list[str]:
    labels = {eval_pass_at_k(s)[0] for s in run.evals}
    uniform = len(labels) == 1
    rows = []
    for s in run.evals:
        label, pass_k = eval_pass_at_k(s)
        name = f"iter_{s['iteration']}" + (" (latest)" if s["iteration"] == run.latest_checkpoint else "")
        rows.append([name, _fmt(s.get("pass@1")), _fmt(pass_k) + ("" if uniform else f" ({label})"),
                     _fmt(s.get("empty_patch_rate")), _fmt(s.get("infra_failures")), _fmt(s.get("attempts"))])
    header = ["checkpoint", "pass@1", labels.pop() if uniform else "pass@k", "empty-patch rate",
              "infra failures", "attempts"]
    return _table(header, rows)


def _control_table(run: RunData, control: RunData) -> list[str]:
    def by_iter(r: RunData) -> dict[int, dict[str, Any]]:
        return {s["iteration"]: s for s in r.evals}

    def reward(r: RunData) -> dict[int, Any]:   # the rollouts that checkpoint n trained on are 0..n-1
        return {rec["rollout"] + 1: rec.get("reward_mean") for rec in (r.metrics.records if r.metrics else [])}

    ours, theirs, ours_r, theirs_r = by_iter(run), by_iter(control), reward(run), reward(control)
    rows = [[f"iter_{n}", _fmt(ours.get(n, {}).get("pass@1")), _fmt(theirs.get(n, {}).get("pass@1")),
             _fmt(ours_r.get(n)), _fmt(theirs_r.get(n))] for n in sorted(ours.keys() | theirs.keys())]
    if not rows:
        return [f"_{NO_EVALS.capitalize()} in either run._"]
    return _table(["checkpoint", "eval pass@1", "control eval pass@1", "reward (last rollout)",
                   "control reward (last rollout)"], rows)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    def row(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [row(header), row(["---"] * len(header)), *(row(r) for r in rows)]


def _fmt(value: Any) -> str:
    if not is_number(value):
        return "–"
    if isinstance(value, int):
        return str(value)
    return f"{value:.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def _utc(timestamp: float) -> str:
    try:
        return datetime.fromtimestamp(timestamp, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):     # a damaged line's time is shown, not fatal
        return f"{timestamp!r} (not a time)"
