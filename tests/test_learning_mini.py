"""The sample path through a real agent CLI, checked token by token: GRPO with mini-swe-agent as the harness.

tests/test_learning.py shows the learning signal through the builtin agent, whose sessions are one
chain each. mini-swe-agent's are not: a reply without exactly one action is a format error, which mini
drops from its history, so the session forks and one attempt becomes several samples
(docs/agent-clis.md). Here `agentrl launch` runs GRPO (MINI_MINIATURE in benchmarks/learning_bench.py: 2
rollouts of 4 x 4 attempts) with every attempt by the real mini-swe-agent CLI in bwrap sandboxes, from a
warm start trained on the scripted teacher's demonstrations through mini (tests/data/learning-mini, made
by tools/learning_fixture.py --harness mini_swe_agent_text), and checks what the trainer was given
(agentrl/report/fidelity.py):
  - every trained token is the one sampled: its recorded log-prob is what the weights that sampled it
    give it after the sample's own prefix (a mask one position off fails this);
  - the turns a fork shares are trained in one of its samples only;
  - every sample carries the reward its attempt was graded with;
  - every sample trains exactly the tokens its trace's turn spans say (a token left out fails this);
  - an attempt that never forked is one sample.
The run must hold forked attempts that passed, or the last checks would have nothing to see.
`tools/learning_mutations.py --test tests/test_learning_mini.py` breaks each of them in the code
(docs/learning.md has its last run).
"""

import os
from pathlib import Path

import pytest
from learning_support import NEEDS_SANDBOX, load

from agentrl.report.fidelity import check_run
from agentrl.train.sft import load_samples

HARNESS = "mini_swe_agent_text"
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    NEEDS_SANDBOX,
]


@pytest.mark.timeout(900)     # about 3 minutes on 2 idle cores
def test_grpo_through_mini_swe_agent_trains_exactly_what_its_sessions_sampled(tmp_path):
    b, fx = load("benchmarks/learning_bench.py"), load("tools/learning_fixture.py")
    fixture = Path(os.environ.get("AGENTRL_LEARNING_MINI_FIXTURE") or fx.FIXTURES[HARNESS])
    manifest = fx.read_manifest(fixture, HARNESS)
    work = tmp_path / "w"
    args = b.parser().parse_args([*manifest["args"], "--work", str(work), "--tools-dir", str(tmp_path / "tools")])
    stages = b.Stages(args, work)
    stages.inputs()
    fx.unpack(fixture, manifest, work, args)
    run = stages.run("grpo", evals=False)
    samples = load_samples([run])
    fx.check_prompts(manifest, samples, fixture)

    rollouts = check_run(run, work / "warm")
    for r in rollouts:
        print(f"rollout {r.rollout}: {r.to_json()}")
    total = {k: sum(getattr(r, k) for r in rollouts)
             for k in ("attempts", "samples", "trained_tokens", "matching_tokens", "twice_trained", "reward_mismatches",
                       "mask_mismatches", "forked_attempts", "forked_passed")}
    print("fidelity: " + ", ".join(f"{k} {v}" for k, v in total.items()))
    assert [r.rollout for r in rollouts] == list(range(args.rollouts))
    # No checkpoint of this run is evaluated, so no export is pruned: the weights of every token are there.
    assert all(r.checked_tokens == r.trained_tokens > 0 for r in rollouts)
    wrong = {r.rollout: r.trained_tokens - r.matching_tokens for r in rollouts}
    assert not any(wrong.values()), f"trained tokens that are not the ones sampled, by rollout: {wrong}"
    assert not any(r.twice_trained for r in rollouts), "a fork's shared turns were trained in two samples"
    assert not any(r.reward_mismatches for r in rollouts), "samples whose reward is not their attempt's grade"
    assert not any(r.mask_mismatches for r in rollouts), "samples that do not train what their traces say"
    # None: every attempt of that rollout forked (16 of 16 happens at this warm start's 2 forks an attempt)
    clean = [r.samples_per_clean_attempt for r in rollouts]
    assert all(c in (None, 1) for c in clean) and 1 in clean, f"samples per clean attempt, by rollout: {clean}"
    assert all(0 < (r.adapter_ms_per_turn or 0) < 1000 for r in rollouts), "the adapter's time per turn, recorded"

    assert total["forked_passed"], (f"no forked attempt passed ({total['forked_attempts']} forked of "
                                    f"{total['attempts']}): the checks above saw no fork's reward")
