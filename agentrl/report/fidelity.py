"""The sample path's fidelity in a run: what the trainer was given is what the agent's session was.

Per rollout, from what the run left on disk (its ledger, buffer, traces and checkpoint exports):

- tokens: each trained token's recorded log-prob is the log-prob that the weights which sampled it
  give that very token after that sample's own prefix (token_versions names the weights: the export
  of that version, or the run's starting model for version 0). A trained token that is not the one
  sampled, or sits one position off, gets another log-prob; equal ones are the sampled ids.
- trained once: two samples of one attempt (a fork) never both train a position of the prefix they
  share, where the tokens are the same turn's.
- reward: every sample carries the reward its attempt was graded with (the attempt's trace).
- forks per attempt (with mini-swe-agent, a format error each), samples per attempt that never forked
  (must be 1), and the adapter's own time per model call (the model's excluded).

`check_run` reads; `compare_log_probs`, `twice_trained` and `reward_mismatches` are pure.
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

from ..rollout.metrics import fidelity
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

    @property
    def match_share(self) -> float | None:
        return self.matching_tokens / self.checked_tokens if self.checked_tokens else None

    def to_json(self) -> dict:
        return {**asdict(self), "match_share": self.match_share}


def compare_log_probs(samples: Sequence[Sample], log_probs: LogProbs) -> tuple[int, int]:
    """(checked, matching) trained tokens: matching where the recorded log-prob is within ATOL of the one the
    sampling weights give the token. Tokens whose weights are gone (log_probs answers None) are not checked."""
    checked = matching = 0
    for s in samples:
        prompt = len(s.tokens) - s.response_length
        trained = np.flatnonzero(s.loss_mask)
        for version in sorted(set(s.token_versions[trained].tolist())):
            mine = trained[s.token_versions[trained] == version]
            got = log_probs(version, s.tokens) if version != UNKNOWN_VERSION else None
            if got is None:
                continue
            checked += len(mine)
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


def graded_rewards(run: RunLayout, ledger: Ledger, rollout: int, groups: Sequence[int]) -> dict[tuple[int, int], float]:
    """Each committed attempt's reward as its trace records the grade."""
    generation = ledger.status(rollout).generation
    out = {}
    for (g, a), commit in ledger.commits(rollout, set(groups)).items():
        path = run.trajectories_dir / f"rollout_{rollout}" / f"g{generation}" / f"{g}-{a}-{commit.try_index}.json"
        if path.exists():
            grade = json.loads(path.read_text()).get("grade")
            if grade is not None:
                out[(g, a)] = float(grade["reward"])
    return out


def model_log_probs(start_model: Path, run: RunLayout) -> LogProbs:
    """log_probs for check_run: the weights of version v, the export of iter_v (the start model for 0),
    loaded once each; None when that export is gone (evaluated exports are pruned)."""
    import torch
    from transformers import AutoModelForCausalLM

    models: dict[int, object] = {}

    def log_probs(version: int, tokens: np.ndarray) -> np.ndarray | None:
        path = start_model if version == 0 else run.checkpoint_dir(version) / "hf"
        if version not in models:
            models[version] = AutoModelForCausalLM.from_pretrained(path).eval() if path.is_dir() else None
        model = models[version]
        if model is None:
            return None
        with torch.inference_mode():
            logits = model(input_ids=torch.from_numpy(tokens.astype(np.int64))[None]).logits[0].float()  # type: ignore
        lp = torch.log_softmax(logits[:-1], -1).gather(1, torch.from_numpy(tokens[1:].astype(np.int64))[:, None])
        return np.concatenate([[np.nan], lp[:, 0].numpy()])
    return log_probs


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
        graded = graded_rewards(run, ledger, r, sorted(groups))
        forked = [key for key, n in Counter((s.group_index, s.attempt) for s in samples).items() if n > 1]
        out.append(RolloutFidelity(
            rollout=r, attempts=len(attempts), samples=len(samples), forks_per_attempt=figures["forks_per_attempt"],
            samples_per_clean_attempt=figures.get("samples_per_clean_attempt"),
            adapter_ms_per_turn=figures.get("adapter_ms_per_turn"), forked_attempts=len(forked),
            forked_passed=sum(graded.get(key, 0.0) > 0 for key in forked),
            trained_tokens=int(sum(int(s.loss_mask.sum()) for s in samples)), checked_tokens=checked,
            matching_tokens=matching, twice_trained=twice_trained(samples),
            reward_mismatches=reward_mismatches(samples, graded)))
    return out
