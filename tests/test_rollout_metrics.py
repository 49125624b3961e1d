"""Rollout metrics count attempts, not fan-out samples, and say when their inputs do not fit."""

import logging

import numpy as np
import pytest

from agentrl.pool.metrics import pass_at_k, rollout_report
from agentrl.sample import Sample, SampleMetadata


def sample(group, attempt, reward, **metadata):
    return Sample(tokens=np.arange(10, dtype=np.int32), response_length=4, loss_mask=np.ones(4, np.uint8),
                  rollout_log_probs=np.zeros(4, np.float32), reward=reward, status="completed", group_index=group,
                  attempt=attempt, metadata=SampleMetadata(**{"empty_patch": "not_triggered", **metadata}))


def test_pass_at_k_matches_the_combinatorial_definition():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)      # 1 - C(3,2)/C(4,2)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_a_fanned_out_attempt_counts_once():
    # group 0: attempt 0 passes with 5 samples, attempts 1-3 fail with one each
    samples = [sample(0, 0, 1.0)] * 5 + [sample(0, a, 0.0) for a in (1, 2, 3)]
    report = rollout_report(samples, ks=(1, 4))
    assert report["attempts"] == 4 and report["samples"] == 8 and report["samples_per_attempt"] == 2.0
    assert report["pass@1"] == pytest.approx(0.25) and report["pass@4"] == 1.0
    assert report["reward_mean"] == pytest.approx(0.25)       # per sample it would be 5/8
    assert report["metric_input_errors"] == 0


def test_empty_patch_drift_and_timings_are_summed_over_attempts():
    samples = [sample(0, 0, 0.0, empty_patch="claimed_completion", drift={"clean": 3, "fork": 1}, agent_s=10.0),
               sample(0, 1, 1.0, drift={"clean": 5}, agent_s=20.0),
               sample(1, 0, 0.0, empty_patch="mid_task_narration", agent_s=30.0),
               sample(1, 1, 0.0, empty_patch="mid_task_narration", agent_s=30.0)]
    report = rollout_report(samples, rollout_s=3600.0, infra_failures=2)
    assert report["empty_patch_rate"] == 0.75
    assert (report["empty_patch/claimed_completion"], report["empty_patch/mid_task_narration"]) == (1, 2)
    assert (report["drift/clean"], report["drift/fork"]) == (8, 1)
    assert report["time/agent_s_mean"] == 22.5 and report["attempts_per_hour"] == 4.0
    assert report["infra_failures"] == 2 and report["zero_variance_groups"] == 1


def test_inputs_that_do_not_fit_are_logged_and_counted(caplog):
    bad = [sample(0, 0, 1.0), sample(0, 0, 0.0), sample(1, 0, 1.0, empty_patch=None)]   # no label
    with caplog.at_level(logging.ERROR, logger="agentrl.metrics"):
        report = rollout_report(bad, ks=(1, 2))
    assert report["metric_input_errors"] == 4    # a reward mismatch, two groups short of 2 attempts, a label
    assert "disagree on the reward" in caplog.text and "fewer than 2 attempts" in caplog.text
    assert "pass@2" not in report and rollout_report([])["metric_input_errors"] == 1


def test_fidelity_counts_forks_the_samples_of_clean_attempts_and_the_adapters_time_per_turn():
    forked = dict(drift={"root": 1, "clean": 3, "fork": 1}, branches=1, turns=6, adapter_s=0.6)
    samples = [sample(0, 0, 0.0, **forked)] * 3 + [sample(0, 1, 1.0, drift={"root": 1, "clean": 4}, turns=5,
                                                          adapter_s=0.2)]
    samples += [sample(0, 2, 1.0, drift={"root": 1, "clean": 4})]         # its adapter time was not recorded
    report = rollout_report(samples)
    assert report["forks_per_attempt"] == pytest.approx(2 / 3)
    assert report["samples_per_clean_attempt"] == 1.0
    assert report["adapter_ms_per_turn"] == pytest.approx(1000 * 0.8 / 11)
    # a clean attempt split into two samples is what samples_per_clean_attempt is there to show
    split = rollout_report([sample(0, 0, 1.0, drift={"root": 1, "clean": 2})] * 2)
    assert split["samples_per_clean_attempt"] == 2.0 and split["forks_per_attempt"] == 0
