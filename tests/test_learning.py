"""The learning signal, end to end: GRPO through the real loop must move the policy toward what passes.

`make learn` (benchmarks/learning_bench.py) in miniature, on the tiny model: pyfix-hint tasks, the
warm start trained on the scripted teacher's demonstrations recorded through the adapter (made by
tools/learning_fixture.py and committed in tests/data/learning, with the probe below; the test makes
the tokenizer and tasks again and refuses a fixture made from others), then `agentrl launch` with
the local executor (the CPU inference server, bwrap sandboxes, the builtin agent, the
ledger, the torch trainer). What is measured is not pass@1, which a few minutes of rollouts cannot
pin down, but the policy's preference for what passes: the warm start's own attempts at held-out
tasks, paired on each task as (passing, failing); where the two part, the log-prob of the passing
attempt's token minus the failing one's. GRPO must raise it by at least MIN_GAIN nats over the warm
start; with the advantage's sign flipped it falls, and with rewards on the wrong attempts it stays.
tools/learning_mutations.py runs this test under each mutation of the learning signal
(docs/learning.md lists which it catches).
"""

import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from learning_support import NEEDS_SANDBOX, load

from agentrl.train.sft import load_samples

MIN_GAIN = 0.4     # nats: unchanged runs +0.63 to +1.02, without a learning signal +0.02 to +0.16 (docs/learning.md)
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.alone,      # both cores: beside other tests its torch threads wait on each other (docs/testing.md)
    NEEDS_SANDBOX,
]


def decision_pairs(samples) -> list[tuple[np.ndarray, int, int]]:
    """For each task, every (passing, failing) pair of its attempts: the tokens they share and the
    first token where they part, the passing attempt's and the failing one's."""
    by_task: dict[int, dict[bool, list]] = defaultdict(lambda: {True: [], False: []})
    for s in samples:
        by_task[s.group_index][s.reward > 0].append(s.tokens)
    pairs = []
    for outcomes in by_task.values():
        for good in outcomes[True]:
            for bad in outcomes[False]:
                n = min(len(good), len(bad))
                differ = np.flatnonzero(good[:n] != bad[:n])
                if len(differ):
                    pairs.append((good[:differ[0]], int(good[differ[0]]), int(bad[differ[0]])))
    return pairs


def preference(model_dir: Path, pairs) -> float:
    """Mean over the pairs of log p(the passing attempt's token) - log p(the failing one's), where they part.

    One token each, in the same context, both of them the policy's own choices: this does not rise
    merely because training sharpens what the policy already favours, as whole attempts' log-probs,
    or the teacher's mistakes (which the warm start avoids already), do (docs/learning.md)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    gaps = []
    for prefix, good, bad in pairs:
        with torch.inference_mode():
            logits = model(input_ids=torch.from_numpy(prefix.astype(np.int64))[None]).logits[0, -1]
        logp = torch.log_softmax(logits.float(), -1)
        gaps.append(float(logp[good] - logp[bad]))
    return float(np.mean(gaps))


@pytest.mark.timeout(1200)     # about 5 minutes on 2 idle cores
def test_grpo_through_the_whole_loop_raises_the_policys_preference_for_what_passes(tmp_path):
    b, fx = load("benchmarks/learning_bench.py"), load("tools/learning_fixture.py")
    # The warm start and the probe, from the fixture (AGENTRL_LEARNING_FIXTURE: another one, made with
    # tools/learning_fixture.py --seed N for calibration); the model, tasks and configs are made here, and
    # must be the ones the fixture was made from (fx.StaleFixture names the command that remakes it).
    fixture = Path(os.environ.get("AGENTRL_LEARNING_FIXTURE") or fx.FIXTURE)
    manifest = fx.read_manifest(fixture)
    work = tmp_path / "w"
    args = b.parser().parse_args([*manifest["args"], "--work", str(work), "--tools-dir", str(tmp_path / "tools")])
    stages = b.Stages(args, work)
    stages.inputs()
    fx.unpack(fixture, manifest, work, args)
    probe = decision_pairs(load_samples([fixture / "probe"]))
    assert len(probe) >= 20, f"the probe has {len(probe)} pairs of a passing and a failing attempt"
    run = stages.run("grpo", evals=False)
    fx.check_prompts(manifest, load_samples([run]), fixture)

    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [round(m["reward_mean"], 2) for m in metrics if "rollout" in m and "reward_mean" in m]
    print(f"training reward by rollout: {rewards}")
    # Each rollout's first step, on the tokens its weights sampled: the stand-in's and the trainer's float32
    # log-probs of one model (agentrl/train/mismatch.py; about 1e-7 mean and 1e-5 max on this machine).
    mismatch = [(m["train/mismatch_tokens"], m.get("train/mismatch_max")) for m in metrics if "rollout" in m]
    assert all(n > 0 and worst < 1e-3 for n, worst in mismatch), f"(tokens, max) by rollout: {mismatch}"
    before = preference(work / "warm", probe)
    after = preference(run / "checkpoints" / f"iter_{args.rollouts}" / "hf", probe)
    print(f"preference for passing attempts: {before:.2f} -> {after:.2f} nats ({after - before:+.2f}, "
          f"{len(probe)} pairs)")
    assert after - before >= MIN_GAIN, (f"GRPO moved the preference for passing attempts by {after - before:+.2f} "
                                        f"nats ({before:.2f} -> {after:.2f}); at least {MIN_GAIN} expected")
