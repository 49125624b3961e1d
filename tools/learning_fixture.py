"""Make tests/data/learning: the learning test's stages before GRPO, made once and committed.

    python tools/learning_fixture.py [--out tests/data/learning] [--seed N] [--work DIR]
    python tools/learning_fixture.py --harness mini_swe_agent_text      (tests/data/learning-mini)

tests/test_learning.py measures what GRPO does to a warm start. Making that warm start (the model, the
tasks, the scripted teacher's demonstrations, 10 epochs of SFT) and the probe (the warm start's own
attempts at the held-out tasks) is more than half of the test's time and none of what it tests, so
this tool makes them with benchmarks/learning_bench.py's stages (MINIATURE: the test's settings) and
writes into OUT what the test reads: warm/ (the checkpoint), probe/ (the probe's samples) and
manifest.json, which records the settings and what they were made from:
  - inputs: the sha256 of the tokenizer, the train tasks' prompts and the held-out tasks, which the
    test makes again (a few seconds) and compares before it trains;
  - prompts: for each train task, the first prompt the builtin agent sent through the adapter (its
    length and sha256), which every sample of the test's GRPO run must begin with.
When either differs the test fails and names this tool: the warm start was trained on something the
code no longer makes. About 5 minutes on 2 cores; OUT is replaced whole, by a rename, at the end.
--seed makes another warm start (for calibrating the test: AGENTRL_LEARNING_FIXTURE=OUT runs it on one).
--harness mini_swe_agent_text makes tests/test_learning_mini.py's (MINI_MINIATURE; every demonstration by
the real mini-swe-agent CLI; no probe: that test checks the samples, not a preference).
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python tools/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import hashlib
import json
import shutil
import tempfile

from agentrl.sample import Sample
from agentrl.train.sft import load_samples
from benchmarks import learning_bench

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "learning"
FIXTURES = {"builtin": FIXTURE, "mini_swe_agent_text": ROOT / "tests" / "data" / "learning-mini"}
TOKENIZER = ("base/tokenizer.json", "base/tokenizer_config.json", "base/chat_template.jinja")
REMAKE = "python tools/learning_fixture.py"


def remake(harness: str = "builtin") -> str:
    return REMAKE + ("" if harness == "builtin" else f" --harness {harness}")


def harness_of(argv: list[str]) -> str:
    return learning_bench.parser().parse_args(argv).harness


class StaleFixture(Exception):
    """The fixture was made from inputs the code no longer makes."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def input_digests(work: Path, args) -> dict[str, str]:
    """The sha256 of each input the warm start was made from, by its path under the work directory
    (a directory's: of its files' paths and contents, in order)."""
    out = {name: sha256((work / name).read_bytes()) for name in (*TOKENIZER, "train.jsonl")}
    tree = work / args.split
    h = hashlib.sha256()
    for f in sorted(p for p in tree.rglob("*") if p.is_file()):
        h.update(f.relative_to(tree).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    out[f"{args.split}/"] = h.hexdigest()
    return out


def first_prompts(samples: list[Sample]) -> dict[str, dict]:
    """Each task's first prompt (its length and sha256) in the samples, which must agree on it."""
    out: dict[str, dict] = {}
    for s in samples:
        prompt = s.tokens[:s.prompt_length]
        mine = {"tokens": int(s.prompt_length), "sha256": sha256(prompt.astype("<i8").tobytes())}
        if out.setdefault(str(s.metadata.task), mine) != mine:
            raise ValueError(f"task {s.metadata.task}: its samples begin with different prompts")
    return out


def check_prompts(manifest: dict, samples: list[Sample], fixture: Path) -> None:
    """StaleFixture unless every attempt's first sample begins with the first prompt its task's demonstrations
    began with. Samples come in the order of their attempts' chains (load_samples); a later one of the same
    attempt may begin elsewhere: after a format error on the first turn, mini-swe-agent's next request
    starts a new chain (a fork) whose prompt holds the error message where the reply was."""
    harness = harness_of(manifest.get("args", []))
    firsts = [s for i, s in enumerate(samples)
              if i == 0 or (samples[i - 1].group_index, samples[i - 1].attempt) != (s.group_index, s.attempt)]
    for s in firsts:
        want = manifest["prompts"].get(str(s.metadata.task))
        if want is None:
            raise StaleFixture(f"{fixture}: has no demonstration of task {s.metadata.task}, which the run trained "
                               f"on: remake it with `{remake(harness)}` and commit it")
        n = want["tokens"]
        if len(s.tokens) < n or sha256(s.tokens[:n].astype("<i8").tobytes()) != want["sha256"]:
            raise StaleFixture(f"{fixture}: the warm start was trained on prompts the {harness} agent and the "
                               f"adapter no longer send (task {s.metadata.task}'s first {n} tokens differ): remake "
                               f"it with `{remake(harness)}` (about 5 minutes) and commit it")


def read_manifest(fixture: Path, harness: str = "builtin") -> dict:
    """The fixture's manifest; StaleFixture when it is missing or was made with other settings than the
    harness's test (learning_bench.MINIATURES; its --seed may differ)."""
    path = fixture / "manifest.json"
    if not path.exists():
        raise StaleFixture(f"{path}: missing: make the fixture with `{remake(harness)} --out {fixture}`")
    manifest = json.loads(path.read_text())
    ours, theirs = (vars(learning_bench.parser().parse_args(a))
                    for a in (learning_bench.MINIATURES[harness], manifest["args"]))
    if ours | {"seed": theirs["seed"]} != theirs:
        raise StaleFixture(f"{fixture}: made with `{' '.join(manifest['args'])}`, not the test's settings "
                           f"(benchmarks/learning_bench.py MINIATURES[{harness!r}]): remake it with "
                           f"`{remake(harness)}` and commit it")
    return manifest


def unpack(fixture: Path, manifest: dict, work: Path, args) -> None:
    """Put the fixture's warm start where learning_bench's stages find it, after checking that WORK's
    inputs (made by Stages.inputs) are the ones it was made from."""
    have = input_digests(work, args)
    changed = sorted(k for k in {*have, *manifest["inputs"]} if have.get(k) != manifest["inputs"].get(k))
    if changed:
        raise StaleFixture(f"{fixture}: made from other inputs than the code makes now ({', '.join(changed)} "
                           f"differ): remake it with `{remake(args.harness)}` (about 5 minutes) and commit it")
    shutil.copytree(fixture / "warm", work / "warm", dirs_exist_ok=True)


def make(out: Path, work: Path, seed: int | None, harness: str = "builtin") -> dict:
    argv = [*learning_bench.MINIATURES[harness]]
    if seed is not None:
        argv[argv.index("--seed") + 1] = str(seed)
    args = learning_bench.parser().parse_args([*argv, "--work", str(work), "--tools-dir", str(work / "tools")])
    stages = learning_bench.Stages(args, work)
    stages.prepare()
    probe = stages.probe() if harness == "builtin" else None
    manifest = {"made_by": remake(harness), "args": argv, "inputs": input_digests(work, args),
                "prompts": first_prompts(load_samples([work / "teacher" / "samples"]))}
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    keep = shutil.ignore_patterns("*.log", "logs")
    shutil.copytree(work / "warm", staging / "warm", ignore=keep)
    if probe is not None:
        shutil.copytree(probe, staging / "probe")
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    old = out.with_name(f".{out.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="learning_fixture.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--harness", choices=sorted(FIXTURES), default="builtin",
                   help="whose learning test: tests/test_learning.py (builtin) or tests/test_learning_mini.py")
    p.add_argument("--out", type=Path, help=f"where the fixture goes (default {FIXTURE}, or FIXTURES[harness])")
    p.add_argument("--seed", type=int, help="another seed than the test's (for calibration)")
    p.add_argument("--work", type=Path, help="where the stages run (default: a temporary directory, removed)")
    args = p.parse_args(argv)
    out = args.out or FIXTURES[args.harness]
    out.parent.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="agentrl-learning-fixture-"))
    manifest = make(out.resolve(), work.resolve(), args.seed, args.harness)
    print(f"{out}: warm start{' and probe' if args.harness == 'builtin' else ''} of {' '.join(manifest['args'])}; "
          f"{len(manifest['prompts'])} train tasks' prompts recorded")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
