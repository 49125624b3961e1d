"""Bounded staleness: what lags more than the bound behind the policy never reaches a train step."""

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from agentrl.sample import UNKNOWN_VERSION, Sample
from agentrl.train.batch import rollout_batch
from agentrl.train.staleness import bound_staleness, staleness_bound


def sample(group: int, attempt: int, reward: float, versions: list[int], mask: list[int] | None = None) -> Sample:
    n = len(versions)
    return Sample(tokens=np.arange(2 + n), response_length=n, loss_mask=mask or [1] * n,
                  rollout_log_probs=np.full(n, -1.0), token_versions=versions, reward=reward, status="completed",
                  group_index=group, attempt=attempt)


def test_the_bound_counts_rollouts_ahead_and_the_servers_own_lag():
    assert staleness_bound(0, 1) == 0      # synchronous, weights every rollout: on-policy
    assert staleness_bound(1, 1) == 1
    assert staleness_bound(0, 3) == 2      # servers keep a version three rollouts
    assert staleness_bound(2, 3) == 4


def test_tokens_past_the_bound_are_masked_and_a_sample_left_with_none_is_dropped():
    groups = {0: [sample(0, 0, 1.0, [5, 5, 4]),          # lags 0, 0, 1
                  sample(0, 1, 0.0, [3, 4, -1, 5], mask=[1, 1, 0, 1]),   # lags 2, 1, (a tool token), 0
                  sample(0, 2, 0.0, [2, 2])]}            # lags 3, 3: nothing left
    batch = rollout_batch(groups)
    bounded, report = bound_staleness(batch, policy_version=5, bound=1, mask_unknown=True)
    assert [s.attempt for s in bounded.samples] == [0, 1]
    assert bounded.samples[1].loss_mask.tolist() == [0, 1, 0, 1]
    assert bounded.samples[0].loss_mask.tolist() == [1, 1, 1]
    # The advantages are those of the whole group: a masked attempt still set the baseline
    assert bounded.advantages.tolist() == batch.advantages[:2].tolist() and bounded.attempt == [(0, 0), (0, 1)]
    assert report.masked_tokens == 3 and report.dropped_samples == 1 and report.unversioned_tokens == 0
    assert report.metrics() == {"staleness/max": 3, "staleness/mean": round((0 * 3 + 1 * 2 + 2 + 3 * 2) / 8, 4),
                                "staleness/unversioned_tokens": 0, "staleness/masked_tokens": 3,
                                "staleness/dropped_samples": 1, "staleness/tokens_lag_0": 3,
                                "staleness/tokens_lag_1": 2, "staleness/tokens_lag_2": 1,
                                "staleness/tokens_lag_3": 2}


def test_unknown_versions_are_masked_only_when_rollouts_run_ahead():
    batch = rollout_batch({0: [sample(0, 0, 1.0, [-1, -1]), sample(0, 1, 0.0, [0, 0])]})
    kept, report = bound_staleness(batch, policy_version=0, bound=0, mask_unknown=False)
    assert kept is batch and report.unversioned_tokens == 2 and report.masked_tokens == 0
    cut, report = bound_staleness(batch, policy_version=0, bound=0, mask_unknown=True)
    assert [s.attempt for s in cut.samples] == [1] and report.masked_tokens == 2 and report.dropped_samples == 1


def test_a_newer_version_than_the_policy_is_not_stale():
    """A trainer resumed from an older checkpoint than the servers' weights retrains them: no lag to bound."""
    batch = rollout_batch({0: [sample(0, 0, 1.0, [4, 4]), sample(0, 1, 0.0, [3])]})
    kept, report = bound_staleness(batch, policy_version=3, bound=0, mask_unknown=True)
    assert kept is batch and report.masked_tokens == 0 and report.lags == {-1: 2, 0: 1}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(-1, 8), st.booleans()), min_size=1, max_size=12),
                min_size=1, max_size=8),
       st.integers(0, 8), st.integers(0, 4), st.booleans())
def test_no_trained_token_past_the_bound_survives_and_every_fresh_one_does(samples, policy, bound, mask_unknown):
    groups: dict[int, list[Sample]] = {}
    for i, tokens in enumerate(samples):
        versions, mask = [v for v, _ in tokens], [1] + [int(m) for _, m in tokens[1:]]    # a sample trains something
        groups.setdefault(i % 3, []).append(sample(i % 3, i, float(i % 2), versions, mask))
    batch = rollout_batch(groups)
    bounded, report = bound_staleness(batch, policy_version=policy, bound=bound, mask_unknown=mask_unknown)

    def fresh(v: int) -> bool:
        return (v != UNKNOWN_VERSION or not mask_unknown) and (v == UNKNOWN_VERSION or policy - v <= bound)

    for s in bounded.samples:
        assert s.loss_mask.any()
        assert all(fresh(v) for v, m in zip(s.token_versions, s.loss_mask, strict=True) if m)
    before = sum(fresh(v) for s in batch.samples for v, m in zip(s.token_versions, s.loss_mask, strict=True) if m)
    after = sum(int(s.loss_mask.sum()) for s in bounded.samples)
    assert after == before
    assert report.masked_tokens == sum(int(s.loss_mask.sum()) for s in batch.samples) - after


def test_rollouts_ahead_are_refused_with_colocated_inference(tmp_path):
    from agentrl.train.config import TrainConfigError, load_train_config

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "p.jsonl").write_text("")
    base = {"model": str(tmp_path), "prompt_data": str(tmp_path / "p.jsonl"), "num_rollouts": 2,
            "rollout_batch_size": 1, "n_samples_per_prompt": 2}
    assert load_train_config({**base, "max_staleness": 1}).max_staleness == 1
    with pytest.raises(TrainConfigError, match="max_staleness 1 with colocated: true: colocated servers release"):
        load_train_config({**base, "max_staleness": 1, "colocated": True})
    with pytest.raises(TrainConfigError, match="train.max_staleness: Input should be greater than or equal to 0"):
        load_train_config({**base, "max_staleness": -1})
