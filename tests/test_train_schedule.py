import logging

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agentrl.train.schedule import (
    _merge_lpt,
    _merge_two_smallest,
    assign_ranks,
    build_schedule,
    build_steps,
)

LOGGER = "agentrl.train.schedule"


def tokens(micro_batch, lengths):
    return sum(lengths[i] for i in micro_batch)


def test_lpt_merge_keeps_the_largest_bin_small_where_merging_the_two_smallest_does_not():
    lengths = [49_000, 49_000, 90_000, 90_000, 90_000]
    singletons = [[i] for i in range(5)]
    assert max(tokens(b, lengths) for b in _merge_lpt(singletons, lengths, 3)) == 139_000
    assert max(tokens(b, lengths) for b in _merge_two_smallest(singletons, lengths, 3)) == 180_000


def test_samples_too_long_to_split_further_are_merged_with_lpt_and_logged(caplog):
    lengths = [49_000, 49_000, 90_000, 90_000, 90_000]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        mbs = build_schedule(lengths, range(5), max_tokens_per_gpu=100_000, dp_size=3)
    assert [tokens(mb, lengths) for mb in mbs] == [139_000, 139_000, 90_000]
    assert sorted(i for mb in mbs for i in mb) == list(range(5))
    [record] = caplog.records
    assert "largest 139000" in record.message and "max_context" in record.message
    assert "n_samples_per_prompt" in record.message


def test_the_count_is_aligned_by_splitting_the_largest_bin_into_balanced_halves(caplog):
    lengths = [40, 30, 20, 10]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        # first-fit packs all 100 tokens into one bin; dp_size=2 halves it 50 / 50
        assert build_schedule(lengths, range(4), max_tokens_per_gpu=100, dp_size=2) == [[0, 3], [1, 2]]
        # 101 tokens need two bins anyway: nothing to split, but first-fit's 100 / 1 is re-dealt 51 / 50
        assert build_schedule(lengths + [1], range(5), max_tokens_per_gpu=100, dp_size=2) == [[0, 3, 4], [1, 2]]
    assert not caplog.records


def test_rebalancing_keeps_the_count_and_the_cap():
    # first-fit: [60, 40] [30, 30, 20, 20], split to 3 for dp: 100 / 60 / 40; re-dealt by LPT: 80 / 60 / 60
    lengths = [60, 40, 30, 30, 20, 20]
    bins = build_schedule(lengths, range(6), max_tokens_per_gpu=100, dp_size=3)
    loads = sorted(sum(lengths[i] for i in b) for b in bins)
    assert len(bins) == 3 and loads == [60, 60, 80]
    # a cap too tight for LPT's dealing keeps first-fit's bins
    tight = build_schedule([50, 50, 50, 50, 49, 1], range(6), max_tokens_per_gpu=100, dp_size=1)
    assert all(sum([50, 50, 50, 50, 49, 1][i] for i in b) <= 100 for b in tight)


def test_a_sample_over_the_cap_gets_a_micro_batch_of_its_own_and_a_warning(caplog):
    lengths = [150, 40, 40]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        mbs = build_schedule(lengths, ["a", "b", "c"], max_tokens_per_gpu=100, dp_size=1)
    assert mbs == [[0], [1, 2]]
    [record] = caplog.records
    assert "longest 150" in record.message and "max_context" in record.message


def test_fewer_samples_than_ranks_names_the_real_cause():
    with pytest.raises(ValueError, match=r"3 samples cannot fill dp_size=4 micro-batches: raise the rollout batch "
                                         r"size or n_samples_per_prompt, or lower dp"):
        build_schedule([10, 10, 10], [0, 1, 2], max_tokens_per_gpu=100, dp_size=4)


def test_global_batch_size_must_match_the_attempts_of_the_one_step():
    lengths, attempts = [10, 20, 30, 40], [0, 0, 1, 2]
    assert build_schedule(lengths, attempts, max_tokens_per_gpu=100, dp_size=1, global_batch_size=3) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="global_batch_size=4 but the samples hold 3 attempts.*build_steps"):
        build_schedule(lengths, attempts, max_tokens_per_gpu=100, dp_size=1, global_batch_size=4)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="2 lengths but 1 attempt ids"):
        build_schedule([1, 2], [0], max_tokens_per_gpu=10, dp_size=1)
    with pytest.raises(ValueError, match="sample 1 has no tokens"):
        build_schedule([1, 0], [0, 1], max_tokens_per_gpu=10, dp_size=1)
    with pytest.raises(TypeError):
        build_schedule([1.5], [0], max_tokens_per_gpu=10, dp_size=1)
    with pytest.raises(ValueError, match="must be positive"):
        build_schedule([1], [0], max_tokens_per_gpu=10, dp_size=0)
    with pytest.raises(ValueError, match="global_batch_size must be at least 1"):
        build_steps([1], [0], max_tokens_per_gpu=10, dp_size=1, global_batch_size=0)


def test_steps_take_whole_attempts_in_order_of_first_appearance():
    lengths = [5, 3, 8, 1, 1, 9, 2]
    attempts = ["x", "y", "x", "z", "w", "w", "v"]
    steps = build_steps(lengths, attempts, max_tokens_per_gpu=10, dp_size=1, global_batch_size=2)
    assert [sorted(i for mb in step for i in mb) for step in steps] == [[0, 1, 2], [3, 4, 5], [6]]


def test_a_leftover_last_step_too_small_for_the_ranks_says_so():
    with pytest.raises(ValueError, match="last step holds the 1 of 5 attempts left over by steps of "
                                         "global_batch_size=2, 1 samples for dp_size=2"):
        build_steps([10] * 5, range(5), max_tokens_per_gpu=100, dp_size=2, global_batch_size=2)


def test_ranks_get_equal_counts_and_balanced_tokens_largest_first():
    lengths = [90, 60, 50, 40, 30, 10]
    ranks = assign_ranks([[i] for i in range(6)], lengths, dp_size=2)
    assert [[tokens(mb, lengths) for mb in rank] for rank in ranks] == [[90, 40, 10], [60, 50, 30]]
    with pytest.raises(ValueError, match="5 micro-batches cannot be dealt evenly to dp_size=2"):
        assign_ranks([[i] for i in range(5)], lengths, dp_size=2)


def test_the_schedule_is_deterministic():
    lengths = [(i * 7919) % 50_000 + 1 for i in range(300)]
    attempts = [i // 3 for i in range(300)]
    first = build_steps(lengths, attempts, max_tokens_per_gpu=65_536, dp_size=8, global_batch_size=16)
    assert first == build_steps(lengths, attempts, max_tokens_per_gpu=65_536, dp_size=8, global_batch_size=16)


@st.composite
def rollouts(draw):
    """(lengths, attempt ids, cap): a mix of short failed attempts, typical ones and some past the cap, or
    only samples longer than half the cap, which cannot share a micro-batch and so force merges."""
    cap = draw(st.sampled_from([65_536, 131_072]))
    fan_outs = draw(st.lists(st.integers(1, 4), min_size=1, max_size=40))
    attempts = [a for a, fan_out in enumerate(fan_outs) for _ in range(fan_out)]
    draw(st.randoms(use_true_random=False)).shuffle(attempts)  # an attempt's samples need not be adjacent
    mixed = st.one_of(st.integers(1, 3_000), st.integers(3_000, 60_000), st.integers(60_000, 150_000))
    lengths = draw(st.lists(draw(st.sampled_from([mixed, st.integers(cap // 2 + 1, 2 * cap)])),
                            min_size=len(attempts), max_size=len(attempts)))
    return lengths, attempts, cap


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rollouts(), st.integers(1, 8), st.integers(1, 12))
def test_every_schedule_invariant_holds(caplog, rollout, dp_size, global_batch_size):
    lengths, attempts, cap = rollout
    caplog.clear()
    samples_per_step = []
    attempt_order = list(dict.fromkeys(attempts))
    for start in range(0, len(attempt_order), global_batch_size):
        step = set(attempt_order[start:start + global_batch_size])
        samples_per_step.append(sum(a in step for a in attempts))
    if min(samples_per_step) < dp_size:
        event("too few samples")
        with pytest.raises(ValueError, match=f"dp_size={dp_size}"):
            build_steps(lengths, attempts, max_tokens_per_gpu=cap, dp_size=dp_size,
                        global_batch_size=global_batch_size)
        return

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        steps = build_steps(lengths, attempts, max_tokens_per_gpu=cap, dp_size=dp_size,
                            global_batch_size=global_batch_size)
    warnings = " ".join(r.message for r in caplog.records)
    assert sorted(i for step in steps for mb in step for i in mb) == list(range(len(lengths)))
    for step, n_samples in zip(steps, samples_per_step, strict=True):
        in_step = [i for mb in step for i in mb]
        assert len(in_step) == n_samples
        assert {attempts[i] for i in in_step}.isdisjoint(attempts[i] for other in steps if other is not step
                                                           for mb in other for i in mb)
        assert len(step) % dp_size == 0 and all(step)
        if any(lengths[i] > cap for i in in_step):
            assert f"longest {max(lengths[i] for i in in_step)}" in warnings
        merged_over = [tokens(mb, lengths) for mb in step if len(mb) > 1 and tokens(mb, lengths) > cap]
        if merged_over:  # only the final merge from single samples, to k = n - n % dp_size bins, breaks the cap
            assert f"largest {max(merged_over)}" in warnings
            assert len(step) == n_samples - n_samples % dp_size
            event("merged over the cap")
        ranks = assign_ranks(step, lengths, dp_size=dp_size)
        assert {len(rank) for rank in ranks} == {len(step) // dp_size}
        assert sorted(mb for rank in ranks for mb in rank) == sorted(step)
    if all(n <= cap for n in lengths) and all(tokens(mb, lengths) <= cap for step in steps for mb in step):
        assert not caplog.records


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 150_000), min_size=2, max_size=30), st.integers(1, 8))
def test_lpt_never_loses_to_merging_the_two_smallest_from_single_samples(lengths, dp_size):
    n = len(lengths)
    k = n - n % dp_size
    if k == 0:
        return
    singletons = [[i] for i in range(n)]
    lpt, naive = _merge_lpt(singletons, lengths, k), _merge_two_smallest(singletons, lengths, k)
    assert sorted(i for b in lpt for i in b) == list(range(n)) == sorted(i for b in naive for i in b)
    assert len(lpt) == len(naive) == k
    assert max(tokens(b, lengths) for b in lpt) <= max(tokens(b, lengths) for b in naive)
