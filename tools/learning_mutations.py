"""Break the learning signal on purpose and see whether tests/test_learning.py notices.

    python tools/learning_mutations.py [--test tests/test_learning.py] [--only NAME,...] [--fixture DIR] [--keep]
    python tools/learning_mutations.py --test tests/test_learning_mini.py      (the sample path through mini)

Each mutation is one textual change to the code, applied to a copy of this working tree (never to
the tree itself); the learning test then runs against the copy (PYTHONPATH puts it first, so the
agentrl commands the test starts import it too). A mutation is caught when the test fails. "none"
runs the unchanged copy first, which must pass. Every run starts from the same warm start and probe:
the committed fixture, or with --fixture one made by tools/learning_fixture.py --seed N --out DIR
(AGENTRL_LEARNING_FIXTURE). One line per mutation: caught or MISSED, and the preference the
test measured. Exit 1 when the unchanged copy fails or a mutation the test claims is missed
(NOT_CLAIMED names the test that catches each of the others). Each test has its own mutations (TESTS):
tests/test_learning_mini.py's break the path from a forked session to its samples.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/test_learning.py"
MINI_TEST = "tests/test_learning_mini.py"

# name -> (file, the text as it is, the text broken)
MUTATIONS: dict[str, tuple[str, str, str]] = {
    "none": ("agentrl/train/advantages.py", "", ""),
    "advantage sign flipped": (
        "agentrl/train/advantages.py",
        "    advantage = attempt_reward - mean[group_of]\n",
        "    advantage = mean[group_of] - attempt_reward\n"),
    "loss mask shifted by one token": (
        "agentrl/train/tensors.py",
        '"loss_mask": torch.from_numpy(np.concatenate([s.loss_mask.astype(np.float32) for s in samples])),',
        '"loss_mask": torch.from_numpy(np.concatenate([np.roll(s.loss_mask, 1).astype(np.float32) '
        'for s in samples])),'),
    "rollout log-probs misaligned by one position": (
        "agentrl/train/tensors.py",
        '"rollout": torch.from_numpy(np.concatenate([s.rollout_log_probs.astype(np.float32) for s in samples])),',
        '"rollout": torch.from_numpy(np.concatenate([np.roll(s.rollout_log_probs, 1).astype(np.float32) '
        'for s in samples])),'),
    "rewards attached to the wrong attempt": (
        "agentrl/train/batch.py",
        "    adv = grpo_advantages([s.reward for s in samples],",
        "    adv = grpo_advantages(np.roll([s.reward for s in samples], 1),"),
}


# tests/test_learning_mini.py's: what a forked session (mini-swe-agent's format errors) could get wrong
MINI_MUTATIONS: dict[str, tuple[str, str, str]] = {
    "none": ("agentrl/adapter/trajectory.py", "", ""),
    "a fork's shared turns trained in every sample": (
        "agentrl/adapter/trajectory.py",
        "            own = [node for node in chain if node.kept and node.index not in trained]\n",
        "            own = [node for node in chain if node.kept]\n"),
    "the reward on a forked attempt's last sample only": (
        "agentrl/pool/attempt.py",
        "        samples = [chain.to_sample(reward=grade.reward, group_index=group,",
        "        samples = [chain.to_sample(reward=grade.reward if chain is finished.chains[-1] else 0.0, "
        "group_index=group,"),
    "one turn's loss mask shifted by one token": (
        "agentrl/adapter/trajectory.py",
        "        mask[trained] = 1\n",
        "        mask[slice(node.prompt_length + 1, node.held_length + 1) if node is own[0] else trained] = 1\n"),
    "each trained turn's last token left out of training": (
        "agentrl/adapter/trajectory.py",
        "        mask[trained] = 1\n",
        "        mask[node.prompt_length:node.held_length - 1] = 1\n"),
}
TESTS = {TEST: MUTATIONS, MINI_TEST: MINI_MUTATIONS}
# What each test prints of its measurement
MEASURED = {TEST: (r"training reward by rollout: \[[^]]*\]", r"preference for passing attempts: -?\d.*"),
            MINI_TEST: (r"fidelity: attempts \d.*",)}
FIXTURE_ENV = {TEST: "AGENTRL_LEARNING_FIXTURE", MINI_TEST: "AGENTRL_LEARNING_MINI_FIXTURE"}


# Mutations the learning test does not claim to catch, and the test that does: with the loss mask one
# token off, GRPO at this scale learns as well as without it (docs/learning.md, "The CI test").
NOT_CLAIMED = {"loss mask shifted by one token": "tests/test_train_tensors.py"}


def copy_tree(dst: Path) -> None:
    ignore = shutil.ignore_patterns(".venv", ".cache", "runs", ".git", "__pycache__", ".pytest_cache", "*.egg-info",
                                    ".agent-clis", ".hypothesis")
    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)
    if (ROOT / ".agent-clis").is_dir():     # `make clis`'s build, which harness installs copy (never mutated)
        (dst / ".agent-clis").symlink_to(ROOT / ".agent-clis")


def mutate(tree: Path, name: str, test: str = TEST) -> None:
    rel, old, new = TESTS[test][name]
    if not old:
        return
    path = tree / rel
    text = path.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"learning_mutations: {rel} no longer holds the text of {name!r} exactly once: "
                         f"update MUTATIONS to the code")
    path.write_text(text.replace(old, new))


def run_test(tree: Path, fixture: Path | None, test: str = TEST) -> tuple[bool, str]:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           **({FIXTURE_ENV[test]: str(fixture.resolve())} if fixture else {})}
    r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-s", "-p", "no:cacheprovider", test], cwd=tree,
                       env=env, capture_output=True, text=True)
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    if lines and " skipped" in lines[-1] and " passed" not in lines[-1] and " failed" not in lines[-1]:
        raise SystemExit(f"learning_mutations: {test} was skipped ({lines[-1]}), so it measured nothing: "
                         f"run it where it can run (bubblewrap, root)")
    # What the test printed (never a traceback's source line, which has the f-string's braces)
    found = []
    for pattern in MEASURED[test]:
        hits = [m.group(0) for m in map(re.compile(pattern).search, lines) if m]
        found += hits[-1:]
    return r.returncode == 0, "; ".join(found)[:300] or lines[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="learning_mutations.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--test", choices=sorted(TESTS), default=TEST, help=f"the test to run (default {TEST})")
    p.add_argument("--only", help="comma-separated mutation names (default: all of the test's)")
    p.add_argument("--keep", action="store_true", help="keep the mutated copies (their paths are printed)")
    p.add_argument("--fixture", type=Path,
                   help="the warm start and probe to run on (default: the committed tests/data/learning)")
    args = p.parse_args(argv)
    mutations = TESTS[args.test]
    names = args.only.split(",") if args.only else list(mutations)
    unknown = sorted(set(names) - set(mutations))
    if unknown:
        p.error(f"unknown mutations {unknown} of {args.test}: choose from {list(mutations)}")
    if args.fixture and not (args.fixture / "manifest.json").exists():
        p.error(f"{args.fixture} holds no fixture (no manifest.json): make one with tools/learning_fixture.py --out "
                f"{args.fixture}")
    failed = False
    for name in ["none", *(n for n in names if n != "none")]:
        tree = Path(tempfile.mkdtemp(prefix="agentrl-mutant-")) / "tree"
        copy_tree(tree)
        mutate(tree, name, args.test)
        passed, why = run_test(tree, args.fixture, args.test)
        if name == "none":
            verdict = "passes" if passed else "FAILS UNCHANGED"
            failed |= not passed
        else:
            verdict = "caught" if not passed else f"missed (see {NOT_CLAIMED[name]})" if name in NOT_CLAIMED \
                else "MISSED"
            failed |= passed and name not in NOT_CLAIMED
        print(f"{name:48s} {verdict:16s} {why}", flush=True)
        if args.keep:
            print(f"    {tree}")
        else:
            shutil.rmtree(tree.parent, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
