import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.train.loss import policy_loss


def tensors(*values, dtype=torch.float64):
    return [torch.tensor(v, dtype=dtype) for v in values]


def test_gradient_flows_only_through_masked_tokens():
    gen = torch.Generator().manual_seed(0)
    logprobs = (-torch.rand(8, generator=gen, dtype=torch.float64)).requires_grad_()
    old = logprobs.detach() + 0.01
    old[[1, 5]] = -math.inf  # padding: must not poison loss or gradient
    mask = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1])
    loss, metrics = policy_loss(logprobs, old, torch.ones(8, dtype=torch.float64), mask,
                                torch.tensor([0, 0, 0, 1, 1, 1, 1, 1]))
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in metrics.values())
    assert (logprobs.grad[mask == 0] == 0).all()
    assert (logprobs.grad[mask == 1] != 0).all()


def test_a_fanned_out_attempt_weighs_as_one():
    # attempt 0 fanned out into 5 samples of 2 tokens, advantage +1; attempt 1 is one sample of 2, advantage -1
    fanned = torch.tensor([0] * 10 + [1] * 2)
    advantages = torch.tensor([1.0] * 10 + [-1.0] * 2, dtype=torch.float64)
    logprobs = torch.full((12,), -1.0, dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(logprobs, logprobs.detach(), advantages, torch.ones(12), fanned)
    loss.backward()
    assert loss.item() == pytest.approx(0.0)  # mean over attempts of (-1, +1)
    assert logprobs.grad[:10].sum().item() == pytest.approx(-0.5)
    assert logprobs.grad[10:].sum().item() == pytest.approx(0.5)
    # keyed by token or by sample instead, the fan-out would outvote the other attempt 10:2 or 5:1
    by_token, _ = policy_loss(logprobs, logprobs.detach(), advantages, torch.ones(12), torch.arange(12))
    by_sample, _ = policy_loss(logprobs, logprobs.detach(), advantages, torch.ones(12), torch.arange(12) // 2)
    assert by_token.item() == pytest.approx(-2 / 3) and by_sample.item() == pytest.approx(-2 / 3)
    # and the attempt weighs the same as when it did not fan out
    single, _ = policy_loss(*tensors([-1.0] * 4, [-1.0] * 4, [1.0, 1.0, -1.0, -1.0]), torch.ones(4),
                            torch.tensor([0, 0, 1, 1]))
    assert single.item() == pytest.approx(loss.item())


@pytest.mark.parametrize(("ratio", "advantage", "eps_clip_high", "clipped"), [
    (1.25, 1.0, 0.28, False),  # clip-higher leaves room to raise a good token's probability
    (1.25, 1.0, 0.20, True),   # the symmetric bound would have stopped it
    (1.25, -1.0, 0.20, False),  # a bad token whose probability rose keeps its full penalty
    (0.75, -1.0, 0.28, True),   # the lower bound is eps_clip=0.2 regardless of eps_clip_high
    (0.85, -1.0, 0.28, False),
    (0.75, 1.0, 0.28, False),
])
def test_clipping_is_asymmetric(ratio, advantage, eps_clip_high, clipped):
    logprobs = torch.tensor([math.log(ratio)], dtype=torch.float64, requires_grad=True)
    old, advantages = tensors([0.0], [advantage])
    loss, metrics = policy_loss(logprobs, old, advantages, torch.ones(1), torch.zeros(1, dtype=int),
                                eps_clip=0.2, eps_clip_high=eps_clip_high)
    loss.backward()
    bound = 1 + eps_clip_high if ratio > 1 else 0.8
    assert loss.item() == pytest.approx(-(bound if clipped else ratio) * advantage)
    assert metrics["clipfrac"].item() == float(clipped)
    assert (logprobs.grad.item() == 0) == clipped
    assert metrics["ratio"].item() == pytest.approx(ratio)


def test_kl_to_a_reference_is_zero_at_the_reference_and_k3_away_from_it():
    logprobs, old, advantages = tensors([-1.0, -2.0, -0.5], [-1.1, -2.0, -0.4], [1.0, -1.0, 0.5])
    mask, attempts = torch.ones(3), torch.tensor([0, 0, 1])
    plain, _ = policy_loss(logprobs, old, advantages, mask, attempts)
    at_ref, metrics = policy_loss(logprobs, old, advantages, mask, attempts, ref_logprobs=logprobs, kl_coef=0.5)
    assert metrics["kl"].item() == 0 and at_ref.item() == plain.item()
    ref = logprobs + torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)
    away, metrics = policy_loss(logprobs, old, advantages, mask, attempts, ref_logprobs=ref, kl_coef=0.5)
    k3 = math.exp(0.5) - 0.5 - 1
    assert metrics["kl"].item() == pytest.approx(k3)
    assert away.item() == pytest.approx(plain.item() + 0.5 * k3)


@pytest.mark.parametrize(("sampler_gap", "weight"), [(math.log(5), 2.0), (math.log(0.5), 0.5)])
def test_truncated_importance_sampling_weighs_the_policy_gradient_up_to_the_cap(sampler_gap, weight):
    logprobs, old, advantages = tensors([-1.0, -2.0], [-1.1, -1.9], [1.0, -0.5])
    mask, attempts = torch.ones(2), torch.tensor([0, 1])
    plain, _ = policy_loss(logprobs, old, advantages, mask, attempts)
    rollout = (old - sampler_gap).requires_grad_()
    weighted, metrics = policy_loss(logprobs.requires_grad_(), old, advantages, mask, attempts, tis_cap=2.0,
                                    rollout_logprobs=rollout)
    assert weighted.item() == pytest.approx(weight * plain.item())
    assert metrics["tis"].item() == pytest.approx(weight)
    weighted.backward()
    assert rollout.grad is None and logprobs.grad is not None


def test_attempts_without_a_counted_token_do_not_dilute_the_default_reduction():
    logprobs, old, advantages = tensors([-1.0, -2.0, -3.0], [-1.1, -1.9, -2.0], [1.0, -0.5, 3.0])
    with_empty, _ = policy_loss(logprobs, old, advantages, torch.tensor([1, 1, 0]), torch.tensor([0, 1, 2]))
    without, _ = policy_loss(logprobs[:2], old[:2], advantages[:2], torch.tensor([1, 1]), torch.tensor([0, 1]))
    assert with_empty.item() == pytest.approx(without.item())
    nothing, _ = policy_loss(logprobs, old, advantages, torch.zeros(3), torch.tensor([0, 1, 2]))
    assert nothing.item() == 0


def test_bad_inputs_are_refused():
    lp, mask, attempts = torch.zeros(3), torch.ones(3), torch.zeros(3, dtype=int)
    with pytest.raises(ValueError, match="advantages has shape \\(2,\\)"):
        policy_loss(lp, lp, torch.zeros(2), mask, attempts)
    with pytest.raises(ValueError, match="flat"):
        policy_loss(torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), attempts[None])
    with pytest.raises(ValueError, match="kl_coef=0.1 needs ref_logprobs"):
        policy_loss(lp, lp, lp, mask, attempts, kl_coef=0.1)
    with pytest.raises(ValueError, match="both tis_cap and rollout_logprobs"):
        policy_loss(lp, lp, lp, mask, attempts, tis_cap=2.0)
    with pytest.raises(ValueError, match="eps_clip"):
        policy_loss(lp, lp, lp, mask, attempts, eps_clip=1.5)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 60), st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**32 - 1), st.booleans())
def test_micro_batch_losses_with_step_counts_add_up_to_the_step_loss(n_tokens, n_attempts, n_micro, seed, extras):
    gen = torch.Generator().manual_seed(seed)
    logprobs = (-torch.randn(n_tokens, generator=gen, dtype=torch.float64).abs()).requires_grad_()
    old, ref, rollout = (logprobs.detach() + 0.3 * torch.randn(n_tokens, generator=gen, dtype=torch.float64)
                         for _ in range(3))
    attempt = torch.randint(0, n_attempts, (n_tokens,), generator=gen)
    advantages = torch.randn(n_attempts, generator=gen, dtype=torch.float64)[attempt]
    mask = torch.rand(n_tokens, generator=gen) < 0.8
    micro_batch = torch.randint(0, n_micro, (n_tokens,), generator=gen)  # any split, tokens need not be adjacent
    options = dict(ref_logprobs=ref, kl_coef=0.1, tis_cap=1.5, rollout_logprobs=rollout) if extras else {}

    def loss_of(idx, **counts):
        return policy_loss(logprobs[idx], old[idx], advantages[idx], mask[idx], attempt[idx],
                           **{k: v[idx] if torch.is_tensor(v) else v for k, v in options.items()}, **counts)

    step_loss, step_metrics = loss_of(torch.arange(n_tokens))
    (step_grad,) = torch.autograd.grad(step_loss, logprobs)
    counts = torch.bincount(attempt, weights=mask.double(), minlength=n_attempts)
    total = torch.zeros((), dtype=torch.float64)
    metric_sums = dict.fromkeys(step_metrics, 0.0)
    for m in range(n_micro):
        loss, metrics = loss_of(micro_batch == m, attempt_token_counts=counts, num_attempts=int((counts > 0).sum()))
        total = total + loss
        for name, value in metrics.items():
            metric_sums[name] += value.item()
    (summed_grad,) = torch.autograd.grad(total, logprobs)
    assert total.item() == pytest.approx(step_loss.item(), abs=1e-9)
    torch.testing.assert_close(summed_grad, step_grad)
    assert metric_sums == pytest.approx({k: v.item() for k, v in step_metrics.items()}, abs=1e-9)
