"""What the trainer's loss sees of a rollout lines up with the tokens it is about (agentrl/train/batch.py,
agentrl/train/tensors.py): each response token's loss mask, its log-prob under the policy that sampled
it, and its attempt's advantage. One position off anywhere and learning degrades without failing, which
the end-to-end learning test may not notice (docs/learning.md): these catch it exactly.
"""

import numpy as np
import torch

from agentrl.sample import Sample
from agentrl.train.batch import plan_steps, rollout_batch
from agentrl.train.tensors import response_slices, token_inputs


def lp(token: int) -> float:
    """The log-prob the sampling policy gave token `token` (a value each position can be told by)."""
    return -token / 1000.0


def multi_turn_sample(group: int, attempt: int, reward: float, prompt: int, turns: list[tuple[int, int]]) -> Sample:
    """A prompt, then per turn (generated, observation) tokens: only the generated ones are trained,
    with their sampling log-probs; an observation's tokens have mask 0 and log-prob 0."""
    mask = np.concatenate([np.r_[np.ones(g), np.zeros(o)] for g, o in turns]).astype(np.uint8)
    n = prompt + len(mask)
    tokens = np.arange(n, dtype=np.int32) + 7 * group + 100 * attempt
    logps = np.where(mask == 1, [lp(t) for t in tokens[prompt:]], 0.0).astype(np.float32)
    return Sample(tokens=tokens, response_length=len(mask), loss_mask=mask, rollout_log_probs=logps, reward=reward,
                  status="completed", group_index=group, attempt=attempt)


def batch():
    groups = {0: [multi_turn_sample(0, 0, 1.0, 5, [(3, 4), (2, 0)]), multi_turn_sample(0, 1, 0.0, 4, [(1, 2), (4, 3)]),
                  multi_turn_sample(0, 2, 0.0, 6, [(2, 0)])],
              1: [multi_turn_sample(1, 0, 0.0, 3, [(2, 2), (2, 1)]), multi_turn_sample(1, 1, 1.0, 5, [(1, 1), (1, 0)])]}
    return rollout_batch(groups)


def test_each_response_tokens_mask_and_sampling_log_prob_line_up_with_the_policys_prediction_of_it():
    b = batch()
    (plan,) = plan_steps(b, global_batch_size=None, max_tokens_per_gpu=10_000, dp_size=1, rank=0)
    indices = [i for mb in plan.micro_batches for i in mb]
    inputs = token_inputs(b, plan, indices)
    # a policy whose log-prob of token t, predicted at position t - 1, is lp(t): the sampling policy itself
    longest = max(len(b.samples[i].tokens) for i in indices)
    per_position = torch.zeros(len(indices), longest)
    for row, i in enumerate(indices):
        toks = b.samples[i].tokens
        per_position[row, :len(toks) - 1] = torch.tensor([lp(t) for t in toks[1:]])
    policy = response_slices(per_position, b, indices)
    trained = inputs["loss_mask"] == 1
    assert int(trained.sum()) == sum(int(b.samples[i].loss_mask.sum()) for i in indices) == 18
    assert torch.allclose(policy[trained], inputs["rollout"][trained])     # the importance ratio is 1, exactly there
    assert (inputs["rollout"][trained] < 0).all() and (inputs["rollout"][~trained] == 0).all()


def test_each_attempts_advantage_follows_its_own_reward():
    b = batch()
    (plan,) = plan_steps(b, global_batch_size=None, max_tokens_per_gpu=10_000, dp_size=1, rank=0)
    indices = [i for mb in plan.micro_batches for i in mb]
    inputs = token_inputs(b, plan, indices)
    for i in range(len(b.samples)):
        mean = np.mean([s.reward for s in b.samples if s.group_index == b.samples[i].group_index])
        assert np.sign(b.advantages[i]) == np.sign(b.samples[i].reward - mean), (i, b.advantages)
    per_token = np.concatenate([np.full(b.samples[i].response_length, np.sign(b.samples[i].reward - 0.5))
                                for i in indices])
    assert (np.sign(inputs["advantages"].numpy()) == per_token).all()
