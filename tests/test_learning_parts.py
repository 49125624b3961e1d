"""The pure parts of the learning demonstration: the control's reward shuffle, intervals, the report.

The shuffle keeps each group's rewards and moves them between its attempts; pass@1's interval is
resampled by task and holds the estimate; a paired difference sees a gain an unpaired one would
blur; `agentrl report --control` sets the run beside its control.
"""

import numpy as np
import pytest
from learning_support import load

from agentrl.eval.stats import paired_difference, pass_at_1
from agentrl.sample import Sample
from agentrl.train.batch import rollout_batch, shuffle_rewards


def sample(group: int, attempt: int, reward: float) -> Sample:
    return Sample(tokens=np.arange(6, dtype=np.int32), response_length=3, loss_mask=np.ones(3, np.uint8),
                  rollout_log_probs=np.zeros(3, np.float32), reward=reward, status="completed",
                  group_index=group, attempt=attempt)


def test_shuffled_rewards_stay_in_their_group_and_move_between_its_attempts():
    groups = {g: [sample(g, a, float(a < 2 + g)) for a in range(8)] + [sample(g, 0, float(2 + g > 0))]
              for g in range(4)}     # attempt 0 fanned out into two samples
    moved = 0
    for seed in ("0/0", "0/1", "1/0"):
        dealt = shuffle_rewards(groups, seed)
        assert dealt == shuffle_rewards(groups, seed)                       # a pure function of the seed
        for g, samples in dealt.items():
            assert sorted(s.reward for s in samples if s is not samples[-1]) == \
                   sorted(s.reward for s in groups[g][:-1])                  # the group's rewards, dealt again
            assert samples[0].reward == samples[-1].reward                  # an attempt keeps one reward
            moved += sum(a.reward != b.reward for a, b in zip(samples, groups[g], strict=True))
        rollout_batch(dealt)                                                 # still valid training data
    assert moved > 0


def results(rates: dict[str, list[int]]) -> list[dict]:
    return [{"task": t, "attempt": i, "reward": float(r)} for t, rs in rates.items() for i, r in enumerate(rs)]


def test_pass_at_1_interval_is_resampled_by_task_and_holds_the_estimate():
    rng = np.random.default_rng(0)
    data = results({f"t{i}": list(rng.integers(0, 2, 2)) for i in range(60)})
    e = pass_at_1(data, seed=1)
    assert e.low < e.value < e.high and e.attempts == 120 and e.tasks == 60
    assert pass_at_1(data, seed=1) == e
    # attempts that agree within a task carry less information: the same mean, a wider interval
    agreeing = results({f"t{i}": [i % 2] * 2 for i in range(60)})
    split = results({f"t{i}": [0, 1] for i in range(60)})
    a, b = pass_at_1(agreeing), pass_at_1(split)
    assert a.value == b.value == 0.5 and (a.high - a.low) > 3 * (b.high - b.low)
    with pytest.raises(ValueError):
        pass_at_1([])


def test_a_paired_difference_sees_a_gain_an_interval_per_side_would_not():
    rng = np.random.default_rng(2)
    hard = {f"t{i}": rng.random() for i in range(50)}            # tasks differ a lot in difficulty
    before = results({t: [int(p > 0.6)] * 2 for t, p in hard.items()})
    after = results({t: [int(p > 0.45)] * 2 for t, p in hard.items()})   # every task a little easier
    d = paired_difference(after, before)
    a, b = pass_at_1(after), pass_at_1(before)
    assert d.low > 0 and a.low < b.high                            # the per-side intervals overlap
    assert d.value == pytest.approx(a.value - b.value)
    with pytest.raises(ValueError, match="share no task"):
        paired_difference(after, results({"other": [1]}))


def test_the_bench_takes_its_harness_defaults_where_not_given_and_the_given_values_otherwise():
    bench = load("benchmarks/learning_bench.py")
    builtin = bench.parser().parse_args([])
    mini = bench.parser().parse_args(["--harness", "mini_swe_agent_text"])
    def settings(a):
        return a.lr, a.eval_n, a.eval_tasks, a.eval_every, a.rollouts
    assert settings(builtin) == (5e-5, 2, 80, 4, 16)
    assert settings(mini) == (1.6667e-5, 8, 40, 24, 24)
    given = bench.parser().parse_args(["--lr", "1e-4", "--harness", "mini_swe_agent_text", "--eval-n", "3"])
    assert (given.lr, given.eval_n, given.eval_tasks) == (1e-4, 3, 40)
    assert all(set(d) == set(bench.HARNESS_DEFAULTS["builtin"]) for d in bench.HARNESS_DEFAULTS.values())
    assert set(bench.HARNESS_DEFAULTS) == set(bench.HARNESSES)


def _est(value: float, low: float, high: float):
    from agentrl.eval.stats import Estimate
    return Estimate(value / 100, low / 100, high / 100, 160, 80)


@pytest.mark.parametrize("harness,gain,minutes", [("builtin", 25, 20), ("mini_swe_agent_text", 20, 45)])
def test_the_bench_meets_a_target_only_where_the_figures_and_their_intervals_clear_its_thresholds(
        harness, gain, minutes):
    bench = load("benchmarks/learning_bench.py")
    def verdicts(g, c=None, seconds=60.0):
        diff = {"GRPO - warm start": _est(*g), **({"control - warm start": _est(*c)} if c else {})}
        return bench.verdicts(harness, diff, seconds)
    names = {"gain": f"gain >= {gain} points", "low": "gain's 95% interval low end >= 10 points",
             "time": f"GRPO within {minutes} minutes", "drift": "|control drift| <= 5 points",
             "interval": "control's 95% interval inside +-10 points"}
    met = verdicts((gain + 5, 12, gain + 15), (-2, -8, 4))
    assert met == dict.fromkeys(names.values(), True)
    assert verdicts((gain + 5, 12, gain + 15)).keys() == {names["gain"], names["low"], names["time"]}
    missed = {    # each figure just past its threshold misses its target alone
        "gain": verdicts((gain - 0.5, 12, gain + 10), (-2, -8, 4)),
        "low": verdicts((gain + 5, 9.5, gain + 15), (-2, -8, 4)),
        "time": verdicts((gain + 5, 12, gain + 15), (-2, -8, 4), seconds=minutes * 60 + 1),
        "drift": verdicts((gain + 5, 12, gain + 15), (-5.5, -9, 1)),
        "interval": verdicts((gain + 5, 12, gain + 15), (-2, -10.5, 4)),
    }
    for which, got in missed.items():
        assert [n for n, ok in got.items() if not ok] == [names[which]], which
    # an interval ending at -10 exactly holds; one a hair wider misses
    assert verdicts((gain + 5, 12, gain + 15), (-3.8, -10.0, 2.5))[names["interval"]]
    assert not verdicts((gain + 5, 12, gain + 15), (-3.8, -10.1, 2.5))[names["interval"]]


def test_the_bench_passes_its_kl_coef_to_both_runs_and_refuses_a_negative_one(tmp_path, capsys):
    from agentrl.run_config import load_run_config
    bench = load("benchmarks/learning_bench.py")
    args = bench.parser().parse_args(["--harness", "mini_swe_agent_text", "--kl-coef", "0.3"])
    for control in (False, True):
        config = load_run_config(bench.run_config(args, tmp_path, control), tmp_path, "grpo.yaml", check_paths=False)
        assert config.train.kl_coef == 0.3 and (config.train.control is not None) == control
    plain = bench.run_config(bench.parser().parse_args([]), tmp_path, False)
    assert "kl_coef" not in plain["train"]        # runs made before the flag keep the same train config
    with pytest.raises(SystemExit):
        bench.main(["--kl-coef", "-1", "--work", str(tmp_path)])
    assert "--kl-coef must be 0 or more, got -1.0" in capsys.readouterr().err


def test_policy_kl_reports_the_kl_the_loss_penalises_and_refuses_mismatched_tokens():
    import torch

    from agentrl.train.loss import policy_loss
    tool = load("tools/policy_kl.py")
    rng = np.random.default_rng(0)
    start = [np.log(rng.uniform(0.05, 1.0, n)) for n in (5, 1, 9)]
    moved = [a + rng.normal(0, 0.4, len(a)) for a in start]
    same = tool.distance(start, start)
    assert (same["mean_abs_change"], same["moved_over_half"], same["kl_k3"], same["tokens"]) == (0, 0, 0, 15)
    d = tool.distance(start, moved)
    change = np.concatenate(moved) - np.concatenate(start)
    assert d["moved_over_half"] == pytest.approx(np.mean(np.abs(change) > 0.5)) and 0 < d["moved_over_half"] < 1
    # The loss's own KL metric, with no policy-gradient term, one sample an attempt: the same figure
    flat = lambda xs: torch.tensor(np.concatenate(xs), dtype=torch.float64)   # noqa: E731
    index = torch.tensor(np.concatenate([[i] * len(a) for i, a in enumerate(start)]))
    _, metrics = policy_loss(flat(moved), flat(moved), torch.zeros(15, dtype=torch.float64),
                             torch.ones(15), index, ref_logprobs=flat(start), kl_coef=1.0)
    assert d["kl_k3"] == pytest.approx(float(metrics["kl"])) and d["kl_k3"] > 0
    with pytest.raises(ValueError, match="same samples"):
        tool.distance(start, moved[:2])
    with pytest.raises(ValueError, match="no trained tokens"):
        tool.distance([np.zeros(0)], [np.zeros(0)])
