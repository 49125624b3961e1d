"""The learning signal, end to end: GRPO through the real loop must move the policy toward what passes.

`make learn` (benchmarks/learning_bench.py) in miniature, on the tiny model: pyfix-hint tasks, the
scripted teacher's demonstrations recorded through the adapter, the warm start, then `agentrl
launch` with the local executor (the CPU inference server, bwrap sandboxes, the builtin agent, the
ledger, the torch trainer). What is measured is not pass@1, which a few minutes of rollouts cannot
pin down, but the policy's preference for the teacher's right plan over its mistakes: on pairs of
the teacher's demonstrations for one held-out task, one passing and one failing, the log-prob of
the right plan's token minus the mistake's where the two part. GRPO must raise it by at least
MIN_GAIN nats over the warm start; with the advantage's sign flipped it falls, and with rewards on
the wrong attempts it rises less. tools/learning_mutations.py runs this test under each mutation of
the learning signal (docs/learning.md lists which it catches); AGENTRL_LEARNING_WORK names a work
directory whose stages before GRPO are reused.
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
MIN_GAIN = 0.9     # nats: not calibrated (unchanged runs +0.86 to +1.15, mutations +0.68 at most)
pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                       reason="needs bubblewrap (make sysdeps) and root for overlay mounts"),
    pytest.mark.skip(reason="not calibrated yet: without a learning signal the probe still rises by up to 0.68 "
                            "nats, with it by 0.86 to 1.15 over three runs: too close for a threshold "
                            "(docs/learning.md, 'The CI test')"),
]


def bench():
    spec = importlib.util.spec_from_file_location("learning_bench", ROOT / "benchmarks" / "learning_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decision_pairs(samples) -> list[tuple[np.ndarray, int, int]]:
    """For each held-out task, every (passing, failing) pair of the teacher's demonstrations: the
    tokens they share and the first token where they part, the right plan's and the mistake's."""
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
    """Mean over the pairs of log p(the right plan's token) - log p(the mistake's), where they part.

    One token each, in the same context: unlike whole demonstrations' log-probs, this does not rise
    merely because training sharpens every token the policy already favours."""
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
    # The probe: the teacher's demonstrations on held-out tasks, six per task, both outcomes.
    b.write_yaml(work / "probe.yaml", {"eval": {
        "tasks": str(work / "heldout"), "n_samples": 6, "seed": 11, "engine": "teacher", "teacher_accuracy": 0.5,
        "save_samples": True, "pool": b.pool(args)}})
    stages.stage("probe", work / "probe-pairs" / "summary.json",
                 ("eval", work / "base", "--config", work / "probe.yaml", "--out", work / "probe-pairs"))
    probe = decision_pairs(load_samples([work / "probe-pairs" / "samples"]))
    assert len(probe) >= 20, f"the probe has {len(probe)} pairs of a passing and a failing demonstration"
    run = stages.run("grpo", evals=False)

    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [round(m["reward_mean"], 2) for m in metrics if "rollout" in m and "reward_mean" in m]
    print(f"training reward by rollout: {rewards}")
    before = preference(work / "warm", probe)
    after = preference(run / "checkpoints" / f"iter_{args.rollouts}" / "hf", probe)
    print(f"preference for passing plans: {before:.2f} -> {after:.2f} nats ({after - before:+.2f}, "
          f"{len(probe)} pairs)")
    assert after - before >= MIN_GAIN, (f"GRPO moved the preference for passing plans by {after - before:+.2f} "
                                        f"nats ({before:.2f} -> {after:.2f}); at least {MIN_GAIN} expected")
