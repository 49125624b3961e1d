"""The learning signal, end to end: GRPO through the real loop must move the policy toward what passes.

`make learn` (benchmarks/learning_bench.py) in miniature, on the tiny model: pyfix-hint tasks, the
scripted teacher's demonstrations recorded through the adapter, the warm start, then `agentrl
launch` with the local executor (the CPU inference server, bwrap sandboxes, the builtin agent, the
ledger, the torch trainer). What is measured is not pass@1, which a few minutes of rollouts cannot
pin down, but the policy's preference for the teacher's right plan over its mistakes: on the
teacher's demonstrations for held-out tasks, the mean log-probability (summed over the loss-masked
tokens) of those that passed minus that of those that failed. GRPO must raise it by at least
MIN_GAIN nats over the warm start; with the advantage's sign flipped it falls, and with rewards on
the wrong attempts it wanders. tools/learning_mutations.py runs this test under each mutation of
the learning signal (docs/learning.md lists which it catches); AGENTRL_LEARNING_WORK names a work
directory whose stages before GRPO are reused.
"""

import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from agentrl.train.sft import load_samples

ROOT = Path(__file__).resolve().parents[1]
MIN_GAIN = 2.0
pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                       reason="needs bubblewrap (make sysdeps) and root for overlay mounts"),
    # Issue 13 is open on this: with 48 demonstrations and 4 rollouts of 32 attempts the warm start
    # earned 6% and GRPO moved the probe by -0.29 nats; the CI-scale settings still need finding.
    pytest.mark.skip(reason="not calibrated yet: at CI scale the warm start passes too rarely for GRPO to "
                            "move the probe (docs/learning.md, 'The CI test')"),
]


def bench():
    spec = importlib.util.spec_from_file_location("learning_bench", ROOT / "benchmarks" / "learning_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def preference(model_dir: Path, samples) -> float:
    """Mean summed log-prob of the passing demonstrations minus that of the failing ones."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    by_outcome: dict[bool, list[float]] = {True: [], False: []}
    for s in samples:
        ids = torch.from_numpy(s.tokens.astype(np.int64))[None]
        with torch.inference_mode():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        start = len(s.tokens) - s.response_length
        picked = logp[start - 1:, :].gather(-1, ids[0, start:, None]).squeeze(-1)
        by_outcome[s.reward > 0].append(float(picked[torch.from_numpy(s.loss_mask.astype(bool))].sum()))
    assert by_outcome[True] and by_outcome[False], "the probe needs demonstrations that pass and that fail"
    return float(np.mean(by_outcome[True]) - np.mean(by_outcome[False]))


@pytest.mark.timeout(1800)     # about 5 minutes on 2 idle cores
def test_grpo_through_the_whole_loop_raises_the_policys_preference_for_what_passes(tmp_path):
    b = bench()
    args = b.parser().parse_args([
        "--work", str(tmp_path), "--seed", "3", "--train-tasks", "48", "--eval-tasks", "12", "--sft-epochs", "12",
        "--teacher-accuracy", "0.7", "--rollouts", "4", "--groups", "8", "--attempts", "8", "--step-attempts", "16",
        "--lr", "3e-4",
        "--eval-every", "4", "--tools-dir", str(tmp_path / "tools")])
    # make learn's model (128 wide, 4 layers): the 64-wide tiny model, warm-started as briefly, earns no
    # reward at all, and a policy that never passes has nothing to learn from
    # AGENTRL_LEARNING_WORK: a work directory to reuse, whose stages before GRPO are kept (what
    # tools/learning_mutations.py gives each mutant: the mutations touch nothing before GRPO)
    work = Path(os.environ.get("AGENTRL_LEARNING_WORK") or tmp_path / "w")
    work.mkdir(exist_ok=True)
    stages = b.Stages(args, work)
    stages.prepare()
    # The probe: the teacher's demonstrations on held-out tasks, two per task, both outcomes.
    b.write_yaml(work / "probe.yaml", {"eval": {
        "tasks": str(work / "heldout"), "n_samples": 2, "seed": 11, "engine": "teacher", "teacher_accuracy": 0.5,
        "save_samples": True, "pool": b.pool(args)}})
    stages.stage("probe", work / "probe" / "summary.json",
                 ("eval", work / "base", "--config", work / "probe.yaml", "--out", work / "probe"))
    probe = load_samples([work / "probe" / "samples"])
    run = stages.run("grpo", evals=False)

    before = preference(work / "warm", probe)
    after = preference(run / "checkpoints" / f"iter_{args.rollouts}" / "hf", probe)
    print(f"preference for passing plans: {before:.2f} -> {after:.2f} nats ({after - before:+.2f})")
    assert after - before >= MIN_GAIN, (f"GRPO moved the preference for passing plans by {after - before:+.2f} "
                                        f"nats ({before:.2f} -> {after:.2f}); at least {MIN_GAIN} expected")
