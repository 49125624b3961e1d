from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.train.advantages import grpo_advantages


def expand(groups: list[list[tuple[float, int]]]) -> tuple[list[float], list[int], list[int]]:
    """Per-sample columns from groups of (reward, fan-out) attempts; attempt ids restart in every group."""
    rewards, group_index, attempt_ids = [], [], []
    for g, attempts in enumerate(groups):
        for a, (reward, fan_out) in enumerate(attempts):
            rewards += [reward] * fan_out
            group_index += [g] * fan_out
            attempt_ids += [a] * fan_out
    return rewards, group_index, attempt_ids


def naive_per_sample(rewards, group_index) -> np.ndarray:
    """Group statistics over samples, so an attempt counts once per sample it fanned out into."""
    rewards, group_index = np.asarray(rewards, dtype=float), np.asarray(group_index)
    out = np.empty_like(rewards)
    for g in np.unique(group_index):
        r = rewards[group_index == g]
        out[group_index == g] = (r - r.mean()) / (r.std() + 1e-6)
    return out


def test_uneven_fan_out_counts_each_attempt_once():
    rewards, groups, attempts = expand([[(1.0, 1), (0.0, 5), (0.0, 1)]])
    adv = grpo_advantages(rewards, groups, attempts)
    # attempt mean 1/3 and std sqrt(2)/3, whatever the fan-out
    expected = np.array([np.sqrt(2)] + [-1 / np.sqrt(2)] * 6)
    np.testing.assert_allclose(adv, expected, rtol=1e-5)
    assert (np.sign(adv) == np.sign(np.array(rewards) - 1 / 3)).all()


def test_fan_out_weighted_statistics_flip_a_sign_that_attempt_statistics_keep():
    # the 5 failed samples drag the per-sample mean to 1.3/7 < 0.3, below the third attempt's reward
    rewards, groups, attempts = expand([[(1.0, 1), (0.0, 5), (0.3, 1)]])
    adv = grpo_advantages(rewards, groups, attempts)
    naive = naive_per_sample(rewards, groups)
    assert adv[-1] < 0 < naive[-1]
    assert adv[0] > 0 and (adv[1:6] < 0).all()


def test_one_batch_wide_group_flips_signs_that_per_group_statistics_keep():
    # an easy task and a hard one: the batch mean 0.55 sits between them
    rewards, groups, attempts = expand([[(1.0, 1), (1.0, 1), (0.8, 1)], [(0.5, 1), (0.0, 1), (0.0, 1)]])
    adv = grpo_advantages(rewards, groups, attempts)
    batch_wide = naive_per_sample(rewards, [0] * len(rewards))
    assert adv[2] < 0 < batch_wide[2]
    assert adv[3] > 0 > batch_wide[3]


def test_attempt_ids_repeat_across_groups_without_mixing_them():
    adv = grpo_advantages([1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1], [7, 8, 7, 8])
    np.testing.assert_allclose(adv, [1, -1, -1, 1], rtol=1e-5)


@pytest.mark.parametrize("std_normalize", [True, False])
def test_a_group_without_variance_gets_exactly_zero(std_normalize):
    rewards, groups, attempts = expand([[(0.1, 2), (0.1, 1), (0.1, 3)], [(1.0, 1), (0.0, 2)]])
    adv = grpo_advantages(rewards, groups, attempts, std_normalize=std_normalize)
    assert (adv[:6] == 0).all()
    assert adv[6] > 0 > adv[7]


def test_without_std_normalisation_advantages_are_centred_rewards():
    rewards, groups, attempts = expand([[(3.0, 1), (0.0, 4), (0.0, 1)]])
    adv = grpo_advantages(rewards, groups, attempts, std_normalize=False)
    np.testing.assert_allclose(adv, [2.0] + [-1.0] * 5)


def test_rewards_differing_within_an_attempt_name_the_attempt():
    with pytest.raises(ValueError, match=r"attempt 'b' of group 4 has differing rewards \[0.0, 1.0\]"):
        grpo_advantages([1.0, 0.0, 1.0], [4, 4, 4], ["a", "b", "b"])


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="one entry per sample"):
        grpo_advantages([1.0, 0.0], [0], [0, 1])
    with pytest.raises(ValueError, match="must be finite"):
        grpo_advantages([1.0, float("nan")], [0, 0], [0, 1])
    assert grpo_advantages([], [], []).shape == (0,)


# integer rewards keep reward - mean exact in sign, so the property is about the code, not rounding
batches = st.lists(st.lists(st.tuples(st.integers(-3, 3), st.integers(1, 4)), min_size=1, max_size=6),
                   min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(batches, st.booleans(), st.randoms(use_true_random=False))
def test_attempt_advantages_sum_to_zero_and_carry_the_sign_of_reward_minus_attempt_mean(groups, std_normalize, rnd):
    rewards, group_index, attempt_ids = expand(groups)
    order = list(range(len(rewards)))
    rnd.shuffle(order)  # samples of an attempt need not be adjacent
    adv = grpo_advantages([rewards[i] for i in order], [group_index[i] for i in order],
                          [attempt_ids[i] for i in order], std_normalize=std_normalize)
    adv = dict(zip(order, adv, strict=True))
    first = 0
    for attempts in groups:
        per_attempt = []
        mean = Fraction(sum(r for r, _ in attempts), len(attempts))
        for reward, fan_out in attempts:
            mine = [adv[i] for i in range(first, first + fan_out)]
            assert mine == [mine[0]] * fan_out
            assert np.sign(mine[0]) == np.sign(reward - mean)
            per_attempt.append(mine[0])
            first += fan_out
        assert abs(sum(per_attempt)) < 1e-9 * max(1.0, max(map(abs, per_attempt)))
