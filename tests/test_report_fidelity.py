"""The sample path's fidelity checks (agentrl/report/fidelity.py) on samples made here: each check fails on the
defect it is for, and passes a correct fork, a retry and a clean attempt."""

import numpy as np

from agentrl.report.fidelity import compare_log_probs, mask_mismatches, reward_mismatches, twice_trained
from agentrl.sample import Sample

# A session as token runs: P prompt (mask 0), A assistant turn (trained), O observation (mask 0).
PROMPT, TURN1, OBS1, TURN2 = [1, 2, 3], [10, 11, 12], [4, 5], [20, 21]


def make(tokens, prompt, trained_runs, *, group=0, attempt=0, reward=1.0, version=0):
    """A sample whose response is tokens[prompt:], trained on the given (start, end) runs of tokens."""
    tokens = np.asarray(tokens, np.int32)
    mask = np.zeros(len(tokens) - prompt, np.uint8)
    for start, end in trained_runs:
        mask[start - prompt:end - prompt] = 1
    logps = np.where(mask == 1, [truth(t) for t in tokens[prompt:]], 0.0)
    return Sample(tokens=tokens, response_length=len(mask), loss_mask=mask, rollout_log_probs=logps, reward=reward,
                  status="completed", group_index=group, attempt=attempt,
                  token_versions=np.where(mask == 1, version, -1).astype(np.int32))


def truth(token: int) -> float:
    return -token / 100.0


def sampler(version, tokens):
    """The sampling weights' log-prob of each token after its prefix: truth(token) for version 0; gone for 1."""
    return None if version == 1 else np.array([truth(t) for t in tokens])


def fork():
    """Turn 1 and its observation, then a bad reply (sample a) and, after a format error, turn 2 (sample b)."""
    trunk = PROMPT + TURN1 + OBS1
    a = make(trunk + [30, 31], 3, [(3, 6), (8, 10)])
    b = make(trunk + [6, 7] + TURN2, 3, [(10, 12)])          # the trunk's turn is trained in a only
    return a, b


def test_trained_tokens_are_the_sampled_ones_unless_a_mask_is_shifted():
    a, b = fork()
    assert compare_log_probs([a, b], sampler) == (7, 7)
    shifted = make(a.tokens, 3, [(4, 7), (8, 10)])
    shifted.rollout_log_probs[:] = a.rollout_log_probs                # the log-probs stay where they were
    checked, matching = compare_log_probs([shifted], sampler)
    assert checked == 5 and matching < 5
    gone = make(a.tokens, 3, [(3, 6)], version=1)                     # its weights' export was pruned
    assert compare_log_probs([gone], sampler) == (0, 0)


def test_a_forks_shared_turn_is_trained_once_and_a_retrys_common_start_is_not_counted():
    a, b = fork()
    assert twice_trained([a, b]) == 0
    twice = make(b.tokens, 3, [(3, 6), (10, 12)])                     # the trunk's turn in b as well
    assert twice_trained([a, twice]) == 3
    # a retry: one prompt sampled twice, the two replies share their first token and then part
    first = make(PROMPT + [10, 11, 99], 3, [(3, 6)])
    second = make(PROMPT + [10, 11, 12] + OBS1, 3, [(3, 6)])
    assert twice_trained([first, second]) == 0
    assert twice_trained([a, make(b.tokens, 3, [(3, 6)], attempt=1)]) == 0    # another attempt's samples


def test_every_sample_carries_its_attempts_graded_reward():
    a, b = fork()
    assert reward_mismatches([a, b], {(0, 0): 1.0}) == 0
    b.reward = 0.0
    assert reward_mismatches([a, b], {(0, 0): 1.0}) == 1
    assert reward_mismatches([a], {}) == 1                            # no grade recorded: counted


def spans(*turns):
    """A trace's chain: (start in the response, kept, trained) per turn."""
    return [{"start": start, "generated": kept, "kept": kept, "drift": "root", "trained": trained,
             "weight_version": 0} for start, kept, trained in turns]


def test_every_sample_trains_exactly_what_its_trace_says():
    a, b = fork()
    traced = {(0, 0): [spans((0, 3, True), (5, 2, True)), spans((0, 3, False), (7, 2, True))]}
    assert mask_mismatches([a, b], traced) == 0
    dropped = make(a.tokens, 3, [(3, 5), (8, 10)])                    # the first turn's last token left out
    assert mask_mismatches([dropped, b], traced) == 1
    assert mask_mismatches([b, a], traced) > 0                        # the trace's samples are in order
    assert mask_mismatches([a, b], {(0, 0): traced[(0, 0)][:1]}) == 2  # b undescribed: its trained tokens


def test_the_sampling_weights_are_asked_for_version_by_version():
    """model_log_probs holds one version's model at a time, so the check must not go back to one it left."""
    asked = []

    def recording(version, tokens):
        asked.append(version)
        return np.array([truth(t) for t in tokens])

    a, b = fork()
    samples = [make(a.tokens, 3, [(3, 6)], version=2), a, make(b.tokens, 3, [(10, 12)], version=1), b]
    assert compare_log_probs(samples, recording) == (3 + 5 + 2 + 2, 12)
    assert asked == sorted(asked) and set(asked) == {0, 1, 2}
