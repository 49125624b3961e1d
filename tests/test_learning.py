"""The learning signal, end to end: GRPO through the real loop must move the policy toward what passes.

`make learn` (benchmarks/learning_bench.py) in miniature, on the tiny model: pyfix-hint tasks, the
scripted teacher's demonstrations recorded through the adapter, the warm start, then `agentrl
launch` with the local executor (the CPU inference server, bwrap sandboxes, the builtin agent, the
ledger, the torch trainer). What is measured is not pass@1, which a few minutes of rollouts cannot
pin down, but the policy's preference for what passes: the warm start's own attempts at held-out
tasks, paired on each task as (passing, failing); where the two part, the log-prob of the passing
attempt's token minus the failing one's. GRPO must raise it by at least MIN_GAIN nats over the warm
start; with the advantage's sign flipped it falls, and with rewards on the wrong attempts it stays.
tools/learning_mutations.py runs this test under each mutation of the learning signal
(docs/learning.md lists which it catches); AGENTRL_LEARNING_WORK names a work directory whose
stages before GRPO are reused.
"""

import importlib.util
import json
import os
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from agentrl.train.sft import load_samples

ROOT = Path(__file__).resolve().parents[1]
MIN_GAIN = 0.4     # nats: unchanged runs +0.63 to +1.02, without a learning signal +0.02 to +0.16 (docs/learning.md)
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.alone,      # both cores: beside other tests its torch threads wait on each other (docs/testing.md)
    pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                       reason="needs bubblewrap (make sysdeps) and root for overlay mounts"),
]


def bench():
    spec = importlib.util.spec_from_file_location("learning_bench", ROOT / "benchmarks" / "learning_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


@pytest.mark.timeout(1500)     # about 9 minutes on 2 idle cores
def test_grpo_through_the_whole_loop_raises_the_policys_preference_for_what_passes(tmp_path):
    b = bench()
    args = b.parser().parse_args([
        "--work", str(tmp_path), "--seed", "3", "--train-tasks", "64", "--eval-tasks", "12", "--sft-epochs", "10",
        "--teacher-accuracy", "0.7", "--rollouts", "4", "--groups", "8", "--attempts", "8", "--step-attempts", "16",
        "--lr", "2e-4",
        "--eval-every", "4", "--tools-dir", str(tmp_path / "tools")])
    # make learn's model (128 wide, 4 layers): the 64-wide tiny model, warm-started as briefly, earns no
    # reward at all, and a policy that never passes has nothing to learn from
    # AGENTRL_LEARNING_WORK: a work directory to reuse, whose stages before GRPO are kept (what
    # tools/learning_mutations.py gives each mutant: the mutations touch nothing before GRPO)
    work = Path(os.environ.get("AGENTRL_LEARNING_WORK") or tmp_path / "w")
    work.mkdir(exist_ok=True)
    stages = b.Stages(args, work)
    stages.prepare()
    # The probe: the warm start's own attempts at the held-out tasks, eight per task, both outcomes.
    config = b.run_config(args, work, control=False)
    config["eval"] = {"tasks": str(work / "heldout"), "n_samples": 8, "seed": 11, "save_samples": True,
                      "pool": b.pool(args)}
    b.write_yaml(work / "probe.yaml", config)
    stages.stage("probe", work / "probe-policy" / "summary.json",
                 ("eval", work / "warm", "--config", work / "probe.yaml", "--out", work / "probe-policy"))
    probe = decision_pairs(load_samples([work / "probe-policy" / "samples"]))
    assert len(probe) >= 20, f"the probe has {len(probe)} pairs of a passing and a failing attempt"
    run = stages.run("grpo", evals=False)

    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [round(m["reward_mean"], 2) for m in metrics if "rollout" in m and "reward_mean" in m]
    print(f"training reward by rollout: {rewards}")
    before = preference(work / "warm", probe)
    after = preference(run / "checkpoints" / f"iter_{args.rollouts}" / "hf", probe)
    print(f"preference for passing attempts: {before:.2f} -> {after:.2f} nats ({after - before:+.2f}, "
          f"{len(probe)} pairs)")
    assert after - before >= MIN_GAIN, (f"GRPO moved the preference for passing attempts by {after - before:+.2f} "
                                        f"nats ({before:.2f} -> {after:.2f}); at least {MIN_GAIN} expected")
