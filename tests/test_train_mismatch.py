"""The sampler/trainer mismatch of a step (agentrl/train/mismatch.py), from constructed log-probs."""

import math

import pytest
import torch

from agentrl.train.mismatch import OVER, Mismatch, finish_step, rollout_metrics, warning

pytestmark = pytest.mark.unit


def test_the_figures_are_over_the_trained_tokens_only():
    train = torch.tensor([-1.0, -2.0, -0.5, -3.0, -9.0])
    rollout = torch.tensor([-1.1, -1.0, -0.5, -3.6, -1.0])    # the last token differs most, but is not trained
    mask = torch.tensor([1, 1, 1, 1, 0])
    m = Mismatch.of(train, rollout, mask).metrics()
    gaps = [0.1, 1.0, 0.0, 0.6]
    assert m["mismatch_tokens"] == 4
    assert m["mismatch_mean"] == pytest.approx(sum(gaps) / 4, rel=1e-6)
    assert m["mismatch_max"] == pytest.approx(1.0, rel=1e-6)
    assert m["mismatch_over"] == pytest.approx(2 / 4)         # 1.0 and 0.6 pass OVER; 0.1 and 0 do not
    log_ratios = [0.1, -1.0, 0.0, 0.6]
    assert m["mismatch_k3"] == pytest.approx(sum(math.exp(x) - 1 - x for x in log_ratios) / 4, rel=1e-6)


def test_k3_estimates_kl_of_the_rollout_against_the_trainer_and_is_zero_when_they_agree():
    # Tokens drawn from the rollout's distribution p; the trainer's q. The mean of k3 over many draws is KL(p || q).
    gen = torch.Generator().manual_seed(0)
    p, q = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.5, 0.3, 0.2])
    draws = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    m = Mismatch.of(q.log()[draws], p.log()[draws], torch.ones_like(draws)).metrics()
    assert m["mismatch_k3"] == pytest.approx(float((p * (p / q).log()).sum()), rel=0.03)
    same = Mismatch.of(p.log()[draws], p.log()[draws], torch.ones_like(draws)).metrics()
    assert same["mismatch_mean"] == same["mismatch_max"] == same["mismatch_k3"] == same["mismatch_over"] == 0


@pytest.mark.parametrize("pieces", [1, 2, 5])
def test_micro_batches_and_ranks_add_up_to_the_whole_step(pieces):
    gen = torch.Generator().manual_seed(pieces)
    train, rollout = -torch.rand(50, generator=gen) * 3, -torch.rand(50, generator=gen) * 3
    mask = (torch.rand(50, generator=gen) > 0.3).int()
    whole = Mismatch.of(train, rollout, mask)
    parts = [Mismatch.of(t, r, k) for t, r, k in zip(train.chunk(pieces), rollout.chunk(pieces), mask.chunk(pieces),
                                                     strict=True)]
    # As reduce_over_ranks does: the raw figures summed, the max by max, then the step's own figures.
    raws = [p.raw() for p in parts]
    reduced = {k: (max if k == "mismatch_max" else sum)(r[k] for r in raws) for k in raws[0]}
    assert finish_step({"loss": 1.5, **reduced}) == pytest.approx({"loss": 1.5, **whole.metrics()})
    assert OVER > 0 and whole.over_count == int(((train - rollout).abs()[mask.bool()] > OVER).sum())


def test_a_step_without_trained_tokens_reports_only_its_count():
    m = Mismatch.of(torch.zeros(3), torch.ones(3), torch.zeros(3)).metrics()
    assert m == {"mismatch_tokens": 0}
    assert warning(m, 0.01) is None


def test_a_rollouts_figures_take_the_worst_token_the_sum_of_tokens_and_the_mean_of_the_rest():
    steps = [{"loss": 1.0, "mismatch_mean": 0.01, "mismatch_max": 0.2, "mismatch_tokens": 10},
             {"loss": 3.0, "mismatch_mean": 0.03, "mismatch_max": 0.9, "mismatch_tokens": 5},
             {"loss": 2.0, "mismatch_tokens": 0}]
    assert rollout_metrics(steps) == pytest.approx({"loss": 2.0, "mismatch_mean": 0.02, "mismatch_max": 0.9,
                                                    "mismatch_tokens": 15})


def test_the_warning_names_the_figure_and_the_key_past_the_threshold():
    step = Mismatch.of(torch.tensor([-1.0, -2.0]), torch.tensor([-1.2, -2.0]), torch.ones(2)).metrics()
    assert warning(step, None) is None
    assert warning(step, 0.11) is None                 # mean 0.1: not past
    text = warning(step, 0.05)
    assert text is not None and "0.1 over 2 trained tokens" in text and "train.mismatch_warn 0.05" in text
