"""The sample path's fidelity in a run: what the trainer was given is what the agent's session was.

Per rollout, from what the run left on disk (its ledger, buffer, traces and checkpoint exports):

- tokens: each trained token's recorded log-prob is the log-prob that the weights which sampled it
  give that very token after that sample's own prefix (token_versions names the weights: the export
  of that version, or the run's starting model for version 0). A trained token that is not the one
  sampled, or sits one position off, gets another log-prob; equal ones are the sampled ids.
- trained once: two samples of one attempt (a fork) never both train a position of the prefix they
  share, where the tokens are the same turn's.
- reward: every sample carries the reward its attempt was graded with (the attempt's trace).
- mask: every sample trains exactly the tokens its trace's spans say it trains (the kept tokens of the turns
  marked trained), so a turn's token left out of training shows, which the log-probs cannot see.
- forks per attempt (with mini-swe-agent, a format error each), samples per attempt that never forked
  (must be 1), and the adapter's own time per model call (the model's excluded).

`check_run` reads; `compare_log_probs`, `twice_trained`, `reward_mismatches` and `mask_mismatches` are pure.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from hpc.buffer import read_rollout
from hpc.ledger import Ledger
from hpc.runlayout import RunLayout

from ..pool.metrics import fidelity
from ..sample import SAMPLE_CODEC, UNKNOWN_VERSION, Sample

ATOL = 2e-3        # nats: the inference server's and a full forward's float32 sums differ by about 1e-5
LogProbs = Callable[[int, np.ndarray], np.ndarray | None]   # (version, tokens) -> log p(tokens[i] | tokens[:i])


@dataclass(frozen=True)
class RolloutFidelity:
    rollout: int
    attempts: int
    samples: int
    forks_per_attempt: float
    samples_per_clean_attempt: float | None
    adapter_ms_per_turn: float | None
    forked_attempts: int         # attempts of more than one sample
    forked_passed: int           # of those, the ones graded above 0
    trained_tokens: int
    checked_tokens: int          # those whose sampling weights are still on disk
    matching_tokens: int         # of the checked, those whose log-prob is the one recorded
    twice_trained: int           # positions of a shared prefix trained in two samples of an attempt
    reward_mismatches: int       # samples whose reward is not their attempt's graded one
    mask_mismatches: int         # response positions whose loss mask is not what the attempt's trace says

    @property
    def match_share(self) -> float | None:
        return self.matching_tokens / self.checked_tokens if self.checked_tokens else None

    def to_json(self) -> dict:
        return {**asdict(self), "match_share": self.match_share}


def compare_log_probs(samples: Sequence[Sample], log_probs: LogProbs) -> tuple[int, int]:
    """(checked, matching) trained tokens: matching where the recorded log-prob is within ATOL of the one the
    sampling weights give the token. Tokens whose weights are gone (log_probs answers None) are not checked."""
    checked = matching = 0
    work = []       # (version, sample, its trained positions of that version), by version: one model at a time
    for s in samples:
        trained = np.flatnonzero(s.loss_mask)
        for version in set(s.token_versions[trained].tolist()) - {UNKNOWN_VERSION}:
            work.append((version, s, trained[s.token_versions[trained] == version]))
    for version, s, mine in sorted(work, key=lambda w: w[0]):
        got = log_probs(version, s.tokens)
        if got is None:
            continue
        checked += len(mine)
        prompt = len(s.tokens) - s.response_length
        matching += int(np.sum(np.abs(got[prompt + mine] - s.rollout_log_probs[mine]) <= ATOL))
    return checked, matching


def twice_trained(samples: Sequence[Sample]) -> int:
    """Positions trained in two samples of the same attempt where both hold the same whole turn: within the
    tokens the two share from the start, runs trained in both that end before the two part. (Two samplings
    of one prompt, a retry, share their first tokens by chance and part inside the turn: not counted.)"""
    by_attempt: dict[tuple[int, int], list[Sample]] = {}
    for s in samples:
        by_attempt.setdefault((s.group_index, s.attempt), []).append(s)
    count = 0
    for siblings in by_attempt.values():
        for i, a in enumerate(siblings):
            for b in siblings[i + 1:]:
                n = min(len(a.tokens), len(b.tokens))
                differ = np.flatnonzero(a.tokens[:n] != b.tokens[:n])
                shared = int(differ[0]) if len(differ) else n
                both = _full_mask(a)[:shared] & _full_mask(b)[:shared]
                ends = np.flatnonzero(both & ~np.r_[both[1:], False])     # each run's last position
                starts = np.flatnonzero(both & ~np.r_[False, both[:-1]])
                count += int(sum(e - s + 1 for s, e in zip(starts, ends, strict=True) if e + 1 < shared))
    return count


def _full_mask(s: Sample) -> np.ndarray:
    return np.concatenate([np.zeros(len(s.tokens) - s.response_length, bool), s.loss_mask.astype(bool)])


def reward_mismatches(samples: Iterable[Sample], graded: dict[tuple[int, int], float]) -> int:
    """Samples whose reward differs from their attempt's graded reward (an attempt without a grade counts)."""
    return sum(graded.get((s.group_index, s.attempt)) != s.reward for s in samples)


def mask_mismatches(samples: Iterable[Sample], chains: dict[tuple[int, int], list[list[dict]]]) -> int:
    """Response positions where a sample's loss mask differs from what its attempt's trace says: the trace's
    chains are the attempt's samples in order, each a list of turn spans (start and kept in the response,
    trained or not). A sample its trace does not describe counts all its trained tokens."""
    out = 0
    index: Counter[tuple[int, int]] = Counter()
    for s in samples:
        key = (s.group_index, s.attempt)
        described = chains.get(key, [])
        i, index[key] = index[key], index[key] + 1
        mask = s.loss_mask.astype(bool)
        if i >= len(described):
            out += int(mask.sum())
            continue
        expected = np.zeros(len(mask), bool)
        for span in described[i]:
            if span["trained"]:
                expected[span["start"]:span["start"] + span["kept"]] = True
        out += int(np.sum(mask != expected))
    return out


def attempt_traces(run: RunLayout, ledger: Ledger, rollout: int, groups: Sequence[int]) -> dict[tuple[int, int], dict]:
    """Each committed attempt's trace (pool/trace.py's AttemptTrace, as JSON): the committed try's."""
    generation = ledger.status(rollout).generation
    out = {}
    for (g, a), commit in ledger.commits(rollout, set(groups)).items():
        path = run.trajectories_dir / f"rollout_{rollout}" / f"g{generation}" / f"{g}-{a}-{commit.try_index}.json"
        if path.exists():
            out[(g, a)] = json.loads(path.read_text())
    return out


def model_log_probs(start_model: Path, run: RunLayout) -> LogProbs:
    """log_probs for check_run: the weights of version v, the export of iter_v (the start model for 0);
    None when that export is gone (evaluated exports are pruned). One version is held at a time, the last
    asked for: compare_log_probs asks version by version."""
    from transformers import AutoModelForCausalLM

    held: dict[int, object] = {}

    def log_probs(version: int, tokens: np.ndarray) -> np.ndarray | None:
        path = start_model if version == 0 else run.checkpoint_dir(version) / "hf"
        if version not in held:
            held.clear()
            held[version] = AutoModelForCausalLM.from_pretrained(path).eval() if path.is_dir() else None
        model = held[version]
        return None if model is None else token_log_probs(model, tokens)
    return log_probs


def token_log_probs(model, tokens: np.ndarray) -> np.ndarray:
    """Each token's log-prob under a transformers causal LM after its own prefix; NaN for the first."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.from_numpy(tokens.astype(np.int64))[None]).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1).gather(1, torch.from_numpy(tokens[1:].astype(np.int64))[:, None])
    return np.concatenate([[np.nan], lp[:, 0].numpy()])


def check_run(run_dir: Path, start_model: Path, log_probs: LogProbs | None = None) -> list[RolloutFidelity]:
    """Every closed rollout of the run, checked."""
    run = RunLayout(Path(run_dir))
    ledger = Ledger(run.ledger_dir)
    log_probs = log_probs or model_log_probs(start_model, run)
    out = []
    for r in ledger.rollouts():
        if not ledger.status(r).closed:
            continue
        groups = read_rollout(ledger, run.buffer_dir, r, SAMPLE_CODEC)
        samples = [s for g in groups.values() for s in g]
        if not samples:
            continue
        attempts = {(s.group_index, s.attempt): s for s in samples}
        figures = fidelity(samples, attempts)
        checked, matching = compare_log_probs(samples, log_probs)
        traces = attempt_traces(run, ledger, r, sorted(groups))
        graded = {key: float(t["grade"]["reward"]) for key, t in traces.items() if t.get("grade") is not None}
        forked = [key for key, n in Counter((s.group_index, s.attempt) for s in samples).items() if n > 1]
        out.append(RolloutFidelity(
            rollout=r, attempts=len(attempts), samples=len(samples), forks_per_attempt=figures["forks_per_attempt"],
            samples_per_clean_attempt=figures.get("samples_per_clean_attempt"),
            adapter_ms_per_turn=figures.get("adapter_ms_per_turn"), forked_attempts=len(forked),
            forked_passed=sum(graded.get(key, 0.0) > 0 for key in forked),
            trained_tokens=int(sum(int(s.loss_mask.sum()) for s in samples)), checked_tokens=checked,
            matching_tokens=matching, twice_trained=twice_trained(samples),
            reward_mismatches=reward_mismatches(samples, graded),
            mask_mismatches=mask_mismatches(samples, {key: t.get("chains", []) for key, t in traces.items()})))
    return out
