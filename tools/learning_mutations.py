"""Break the learning signal on purpose and see whether tests/test_learning.py notices.

    python tools/learning_mutations.py [--only NAME,...] [--fixture DIR] [--keep]

Each mutation is one textual change to the code, applied to a copy of this working tree (never to
the tree itself); the learning test then runs against the copy (PYTHONPATH puts it first, so the
agentrl commands the test starts import it too). A mutation is caught when the test fails. "none"
runs the unchanged copy first, which must pass. Every run starts from the same warm start and probe:
the committed fixture, or with --fixture one made by tools/learning_fixture.py --seed N --out DIR
(AGENTRL_LEARNING_FIXTURE). One line per mutation: caught or MISSED, and the preference the
test measured. Exit 1 when the unchanged copy fails or a mutation the test claims is missed
(NOT_CLAIMED names the test that catches each of the others).
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


# Mutations the learning test does not claim to catch, and the test that does: with the loss mask one
# token off, GRPO at this scale learns as well as without it (docs/learning.md, "The CI test").
NOT_CLAIMED = {"loss mask shifted by one token": "tests/test_train_tensors.py"}


def copy_tree(dst: Path) -> None:
    ignore = shutil.ignore_patterns(".venv", ".cache", "runs", ".git", "__pycache__", ".pytest_cache", "*.egg-info",
                                    ".agent-clis", ".hypothesis")
    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)


def mutate(tree: Path, name: str) -> None:
    rel, old, new = MUTATIONS[name]
    if not old:
        return
    path = tree / rel
    text = path.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"learning_mutations: {rel} no longer holds the text of {name!r} exactly once: "
                         f"update MUTATIONS to the code")
    path.write_text(text.replace(old, new))


def run_test(tree: Path, fixture: Path | None) -> tuple[bool, str]:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           **({"AGENTRL_LEARNING_FIXTURE": str(fixture.resolve())} if fixture else {})}
    r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-s", "-p", "no:cacheprovider", TEST], cwd=tree,
                       env=env, capture_output=True, text=True)
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    if lines and " skipped" in lines[-1] and " passed" not in lines[-1] and " failed" not in lines[-1]:
        raise SystemExit(f"learning_mutations: {TEST} was skipped ({lines[-1]}), so it measured nothing: "
                         f"run it where it can run (bubblewrap, root)")
    # What the test printed (never a traceback's source line, which has the f-string's braces)
    found = []
    for pattern in (r"training reward by rollout: \[[^]]*\]", r"preference for passing attempts: -?\d.*"):
        hits = [m.group(0) for m in map(re.compile(pattern).search, lines) if m]
        found += hits[-1:]
    return r.returncode == 0, "; ".join(found)[:300] or lines[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="learning_mutations.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help="comma-separated mutation names (default: all)")
    p.add_argument("--keep", action="store_true", help="keep the mutated copies (their paths are printed)")
    p.add_argument("--fixture", type=Path,
                   help="the warm start and probe to run on (default: the committed tests/data/learning)")
    args = p.parse_args(argv)
    names = args.only.split(",") if args.only else list(MUTATIONS)
    unknown = sorted(set(names) - set(MUTATIONS))
    if unknown:
        p.error(f"unknown mutations {unknown}: choose from {list(MUTATIONS)}")
    if args.fixture and not (args.fixture / "manifest.json").exists():
        p.error(f"{args.fixture} holds no fixture (no manifest.json): make one with tools/learning_fixture.py --out "
                f"{args.fixture}")
    failed = False
    for name in ["none", *(n for n in names if n != "none")]:
        tree = Path(tempfile.mkdtemp(prefix="agentrl-mutant-")) / "tree"
        copy_tree(tree)
        mutate(tree, name)
        passed, why = run_test(tree, args.fixture)
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
