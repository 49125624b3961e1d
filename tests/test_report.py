"""`agentrl report`: a run directory's metrics and eval results as report.md beside PNG plots."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.commands.report import main
from agentrl.report.data import class_counts, parse_metrics, read_run, series, training_plots
from agentrl.report.plots import draw
from agentrl.report.render import report_plots, write_report
from hpc.runlayout import RunLayout

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CONFIG = {"train": {"model": "/models/qwen3-8b", "prompt_data": "prompts.jsonl", "num_rollouts": 10,
                    "rollout_batch_size": 4, "n_samples_per_prompt": 2, "global_batch_size": 4, "lr": 1e-6},
          "pool": {"harness": "claude_code", "max_agents": 8},
          "inference": {"engine": "sglang"}}


def train_line(r: int, **extra) -> dict:
    """A trainer line as Trainer._record writes it (rollout_report, timings, train/*) for rollout r."""
    line = {"kind": "train", "time": 1_700_000_000.0 + 60 * r, "rollout": r, "groups": 4, "attempts": 8,
            "samples": 8 + r, "samples_per_attempt": (8 + r) / 8, "reward_mean": 0.125 * r,
            "zero_variance_groups": 3 - r, "response_tokens": 4000, "trained_tokens": 3800, "infra_failures": r % 2,
            "pass@1": 0.125 * r, "pass@2": 0.25 * r, "empty_patch_rate": 0.25 - 0.125 * r,
            "drift/clean": 20 + r, "drift/realign": r, "drift/fork": 1, "drift/root": 8 + r,
            "time/boot_s_mean": 2.0, "time/agent_s_mean": 30.0 + r, "time/grade_s_mean": 4.0,
            "attempts_per_hour": 480.0 + r, "trained_tokens_per_s": 63.3, "metric_input_errors": 0,
            "rollout_s": 60.0 - r, "train/loss": 0.01 * r, "train/pg_loss": 0.01 * r, "train/clipfrac": 0.1,
            "train/approx_kl": 0.001, "train/ratio": 1.0, "train/grad_norm": 0.5 + r, "train_s": 5.0 + r,
            "checkpoint_s": 1.5, "fingerprint": "cf78bc5efba99be2", "train/mismatch_mean": 0.002 * (r + 1),
            "train/mismatch_max": 0.1 * (r + 1), "train/mismatch_k3": 1e-5, "train/mismatch_over": 0.0,
            "train/mismatch_tokens": 3800}
    if r == 0:      # rollout_report writes only the empty-patch classes it saw
        line.update({"empty_patch/claimed_completion": 1, "empty_patch/mid_task_narration": 1})
    if r == 1:
        line["empty_patch/mid_task_narration"] = 1
    if r != 2:      # publish_every=2 with the last rollout unpublished
        line.update({"weight_version": r + 1, "publish_s": 2.0, "inference_servers": 2})
    return {**line, **extra}


@pytest.fixture
def run_dir(tmp_path) -> Path:
    run = RunLayout.create(tmp_path / "run", CONFIG, run_id="report-test")
    lines = [json.dumps(train_line(r)) for r in range(3)]
    lines.insert(2, '{"kind": "train", "rollout": 2, "reward_mean"')      # a line cut short by a crash
    run.metrics_path.write_text("\n".join(lines) + "\n")
    for n in (1, 2):
        run.checkpoint_dir(n).mkdir()
        run.eval_dir(n).mkdir(parents=True)
        (run.eval_dir(n) / "summary.json").write_text(json.dumps(
            {"iteration": n, "pass@1": 0.2 * n, "pass@k": 0.3 * n, "k": 4, "empty_patch_rate": 0.1 / n,
             "infra_failures": n - 1, "attempts": 40, "timings": {"agent_s_mean": 31.0}}))
    run.publish_latest(2)
    return run.root


def referenced_pngs(report: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", report)


def assert_pngs_match_report(out: Path) -> str:
    """Every PNG the report names exists and is a real PNG; every PNG there is named."""
    report = (out / "report.md").read_text()
    names = referenced_pngs(report)
    for name in names:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC, name
        assert len(data) > 5000, f"{name} is {len(data)} bytes: an empty figure?"
    assert sorted(names) == sorted(p.name for p in out.glob("*.png"))
    return report


# ---------------------------------------------------------------- data shaping


def test_metric_lines_that_cannot_be_used_are_counted_and_a_rerecorded_rollout_keeps_its_last_line():
    text = "\n".join([json.dumps(train_line(1)), "not json", "[1, 2]", json.dumps({"rollout": 5}),
                      json.dumps({"kind": "train", "reward_mean": 0.5}), "",
                      json.dumps({"kind": "eval", "iteration": 1}), json.dumps(train_line(0)),
                      json.dumps(train_line(1, reward_mean=0.9))])
    log = parse_metrics(text)
    assert log.unreadable == [2, 3, 4, 5]
    assert [r["rollout"] for r in log.records] == [0, 1]
    assert log.records[1]["reward_mean"] == 0.9
    assert log.rerecorded == [1]


def test_series_leave_out_rollouts_without_the_key():
    records = [train_line(r) for r in range(3)]
    assert series(records, "publish_s") == ([0, 1], [2.0, 2.0])
    assert series(records, "reward_mean") == ([0, 1, 2], [0.0, 0.125, 0.25])


def test_class_counts_are_zero_where_a_rollout_saw_none_and_root_is_not_drift():
    records = [train_line(r) for r in range(3)]
    assert class_counts(records, "empty_patch/", counted_by="empty_patch_rate") == {
        "claimed_completion": ([0, 1, 2], [1.0, 0.0, 0.0]),
        "mid_task_narration": ([0, 1, 2], [1.0, 1.0, 0.0])}
    drift = class_counts(records, "drift/", exclude=("root",), order=("clean", "realign", "fork"))
    assert list(drift) == ["clean", "realign", "fork"]
    assert drift["realign"] == ([0, 1, 2], [0.0, 1.0, 2.0])


# ---------------------------------------------------------------- figures


def test_line_figures_hold_their_series():
    records = [train_line(r) for r in range(3)]
    reward = next(p for p in training_plots(records) if p.name == "reward")
    fig = draw(reward)
    (ax,) = fig.axes
    drawn = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    assert drawn == reward.panels[0].series
    assert set(drawn) == {"reward_mean", "pass@1", "pass@2"}
    assert drawn["pass@2"] == ([0, 1, 2], [0.0, 0.25, 0.5])
    assert fig.get_suptitle() == reward.title and ax.get_xlabel() == "rollout" and ax.get_ylabel()


def test_the_sampler_and_trainer_mismatch_has_its_figure_and_a_run_before_it_says_why_not():
    records = [train_line(r) for r in range(3)]
    [plot] = [p for p in training_plots(records) if p.name == "mismatch"]
    assert plot.panels[0].series == {"train/mismatch_mean": ([0, 1, 2], [0.002, 0.004, 0.006]),
                                     "train/mismatch_max": ([0, 1, 2], [0.1, 0.2, 0.30000000000000004])}
    assert [set(p.series) for p in plot.panels[1:]] == [{"train/mismatch_k3"}, {"train/mismatch_over"}]
    before = [{k: v for k, v in line.items() if "mismatch" not in k} for line in records]
    [plot] = [p for p in training_plots(before) if p.name == "mismatch"]
    assert not plot.panels and "no rollout recorded train/mismatch_*" in (plot.skipped or "")


def test_stacked_bars_sit_on_the_classes_below_them():
    records = [train_line(r) for r in range(3)]
    drift = next(p for p in training_plots(records) if p.name == "drift")
    (ax,) = draw(drift).axes
    clean, realign, fork = ax.containers
    assert [b.get_height() for b in realign] == [0.0, 1.0, 2.0]
    assert [b.get_y() for b in realign] == [20.0, 21.0, 22.0]              # on top of clean
    assert [b.get_y() for b in fork] == [20.0, 22.0, 24.0]
    assert [c.get_label() for c in ax.containers] == ["clean", "realign", "fork"]


def test_eval_figure_plots_each_checkpoint(run_dir):
    plot = next(p for p in report_plots(read_run(run_dir)) if p.name == "eval")
    (ax,) = draw(plot).axes
    drawn = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    assert drawn == {"pass@1": ([1, 2], [0.2, 0.4]), "pass@4": ([1, 2], [0.3, 0.6])}
    assert ax.get_xlabel().startswith("checkpoint")


# ---------------------------------------------------------------- the report


def test_report_of_a_run_with_metrics_and_evals(run_dir):
    path = write_report(run_dir)
    assert path == run_dir / "report.md"
    report = assert_pngs_match_report(run_dir)
    assert {"reward.png", "eval.png", "empty_patch.png", "drift.png", "samples_per_attempt.png", "timings.png",
            "throughput.png", "infra_failures.png"} <= set(referenced_pngs(report))
    assert "Skipped" not in report
    assert "1 metric line could not be read (metrics.jsonl line 3)" in report
    assert "# Run report: report-test" in report and "latest checkpoint: iter_2" in report
    assert "| harness | claude_code |" in report and "| model | /models/qwen3-8b |" in report
    assert "| batch | 4 prompts × 2 attempts = 8 attempts per rollout |" in report
    assert "| optimizer step | 4 attempts (2 steps per rollout) |" in report
    assert "| checkpoint | pass@1 | pass@4 | empty-patch rate | infra failures | attempts |" in report
    assert "| iter_1 | 0.2 | 0.3 | 0.1 | 0 | 40 |" in report
    assert "| iter_2 (latest) | 0.4 | 0.6 | 0.05 | 1 | 40 |" in report
    assert "| reward_mean | 0.25 | 2 |" in report
    assert "| weight_version | 2 | 1 |" in report        # the last published version, from rollout 1


def test_without_eval_results_the_eval_plot_is_skipped_with_the_reason(run_dir, tmp_path):
    for n in (1, 2):
        (run_dir / "eval" / f"iter_{n}" / "summary.json").unlink()
    out = tmp_path / "out"
    assert main([str(run_dir), "--out", str(out)]) == 0
    report = assert_pngs_match_report(out)
    assert "_Skipped: no eval results yet._" in report
    assert "eval.png" not in report and not (out / "eval.png").exists()
    assert "eval/iter_1 has no summary.json yet" in report
    assert "reward.png" in referenced_pngs(report)


def test_a_rewritten_report_drops_a_plot_that_lost_its_data(run_dir):
    write_report(run_dir)
    assert (run_dir / "eval.png").exists()
    (run_dir / "eval" / "iter_2" / "summary.json").write_text("{not json")
    (run_dir / "eval" / "iter_1" / "summary.json").write_text(json.dumps({"iteration": 1, "attempts": 40}))
    report = write_report(run_dir).read_text()
    assert "eval/iter_2/summary.json could not be read" in report
    assert "| iter_1 | – | – | – | – | 40 |" in report      # missing keys: shown as missing, not as 0
    assert not (run_dir / "eval.png").exists()
    assert_pngs_match_report(run_dir)


def test_a_run_without_metrics_gets_a_report_saying_so(tmp_path, capsys):
    root = RunLayout.create(tmp_path / "fresh", CONFIG, run_id="fresh").root
    assert main([str(root)]) == 0
    assert capsys.readouterr().out.strip() == str(root / "report.md")
    report = (root / "report.md").read_text()
    assert "_No training metrics yet: metrics.jsonl does not exist._" in report
    assert "latest checkpoint: none yet" in report and "rollouts recorded: none" in report
    assert referenced_pngs(report) == [] and list(root.glob("*.png")) == []
    assert report.count("_Skipped: no training metrics yet._") == 9


def test_a_directory_that_is_not_a_run_exits_2(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "agentrl report:" in err and "is not a run directory (no run.yaml)" in err
    assert not (tmp_path / "report.md").exists()


@pytest.mark.integration
def test_the_command_runs_headless_and_leaves_the_run_untouched(run_dir, tmp_path):
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    out = tmp_path / "elsewhere"
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["MPLBACKEND"] = "TkAgg"         # a display backend: the report must not use it
    r = subprocess.run([sys.executable, "-c", "import sys; from agentrl.commands.report import main; "
                        "sys.exit(main(sys.argv[1:]))", str(run_dir), "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out / "report.md")
    assert_pngs_match_report(out)
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before


def test_a_control_run_is_set_beside_the_run(run_dir, tmp_path):
    control = RunLayout.create(tmp_path / "control", {**CONFIG, "train": {**CONFIG["train"],
                                                                          "control": "shuffle_rewards"}},
                               run_id="report-control")
    control.metrics_path.write_text("\n".join(json.dumps(train_line(r, reward_mean=0.05)) for r in range(2)) + "\n")
    control.eval_dir(2).mkdir(parents=True)
    (control.eval_dir(2) / "summary.json").write_text(json.dumps({"iteration": 2, "pass@1": 0.11, "k": 4,
                                                                  "pass@k": 0.2, "attempts": 40}))
    assert main([str(run_dir), "--control", str(control.root), "--out", str(tmp_path / "out")]) == 0
    report = assert_pngs_match_report(tmp_path / "out")
    assert "## Against the control" in report and "control.png" in report
    row = next(line for line in report.splitlines() if line.startswith("| iter_2 "))
    assert [c.strip() for c in row.strip("|").split("|")][:5] == ["iter_2", "0.4", "0.11", "0.125", "0.05"]
    assert main([str(run_dir), "--control", str(tmp_path / "nowhere")]) == 2
