"""The training sample: its codec for hpc.buffer keeps every array and metadata field exactly, and it
is made from the adapter's chain in one place."""

import numpy as np
import pytest

from agentrl.adapter.trajectory import TrajectoryTree, Turn
from agentrl.harness.empty_patch import EmptyPatchClass
from agentrl.sample import SAMPLE_CODEC, AttemptMetadata, Sample, SampleMetadata
from hpc.buffer import read_shard, write_shard
from hpc.ledger import Ledger
from hpc.records import RecordError

ATTEMPT = AttemptMetadata(harness="builtin", task="t-1", exit_code=0, agent_timed_out=False,
                          empty_patch=EmptyPatchClass.NOT_TRIGGERED, patch_bytes=120, turns=3, branches=1,
                          drift={"root": 1, "clean": 1, "fork": 1}, tool_calls=2, boot_s=0.25, agent_s=3.125,
                          grade_s=1.0)


def a_sample(**metadata) -> Sample:
    return Sample(tokens=np.array([0, 151_643, 2**31 - 1, 5]), response_length=3, loss_mask=[1, 0, 1],
                  rollout_log_probs=np.array([-1e-7, 0.0, -3.5e-3]), token_versions=[6, -1, 7], reward=0.5,
                  status="completed",
                  group_index=0, attempt=1,
                  metadata=SampleMetadata(**ATTEMPT.model_dump(), chain_turns=2, trained_tokens=2,
                                          weight_version=7, truncated=False, ill_formed_turns=0, **metadata))


def test_the_codec_round_trips_a_sample_exactly(tmp_path):
    led = Ledger(tmp_path / "ledger")
    led.open_rollout(0, [0], 2)
    claim = next(c for c in iter(lambda: led.claim("w"), None) if c.attempt == 1)
    sample = a_sample()
    [back] = read_shard(tmp_path / write_shard(tmp_path, claim, [sample], SAMPLE_CODEC), SAMPLE_CODEC)[1]
    for name, dtype in (("tokens", np.int32), ("loss_mask", np.uint8), ("rollout_log_probs", np.float32),
                        ("token_versions", np.int32)):
        got, sent = getattr(back, name), getattr(sample, name)
        assert got.dtype == dtype and got.tobytes() == sent.tobytes(), name
    assert (back.response_length, back.prompt_length, back.reward, back.status, back.group_index, back.attempt) == \
        (3, 1, 0.5, "completed", 0, 1)
    assert back.metadata == sample.metadata and back.metadata.empty_patch is EmptyPatchClass.NOT_TRIGGERED
    assert back.metadata.timings() == {"boot_s": 0.25, "agent_s": 3.125, "grade_s": 1.0}
    assert SAMPLE_CODEC.from_record(SAMPLE_CODEC.to_record(Sample(
        tokens=[1, 2], response_length=0, loss_mask=[], rollout_log_probs=[], reward=0, status="completed",
        group_index=0, attempt=0))).metadata == SampleMetadata()          # nothing recorded: all None
    # A shard of older code has no token_versions: every token's version is unknown
    old = SAMPLE_CODEC.to_record(sample)
    del old["token_versions"]
    assert SAMPLE_CODEC.from_record(old).token_versions.tolist() == [-1, -1, -1]


@pytest.mark.parametrize("change, message", [
    (lambda r: r["metadata"].update(worker="w1"), "worker"),                     # a field this version lacks
    (lambda r: r["metadata"].update(exit_code="zero"), "exit_code"),
    (lambda r: r.pop("reward"), "reward"),
    (lambda r: r.update(loss_mask=np.ones(2, np.uint8)), "loss_mask has 2 entries"),
    (lambda r: r.update(token_versions=np.ones(4, np.int32)), "token_versions has 4 entries"),
])
def test_a_record_that_is_not_a_sample_is_refused_naming_the_shard(tmp_path, change, message):
    led = Ledger(tmp_path / "ledger")
    led.open_rollout(0, [0], 2)
    claim = next(c for c in iter(lambda: led.claim("w"), None) if c.attempt == 1)

    class Corrupting(type(SAMPLE_CODEC)):
        def to_record(self, item):
            record = super().to_record(item)
            change(record)
            return record

    path = tmp_path / write_shard(tmp_path, claim, [a_sample()], Corrupting())
    with pytest.raises(RecordError, match=f"{path}: holds an invalid record at index 0 .*{message}"):
        read_shard(path, SAMPLE_CODEC)


def test_a_chain_becomes_a_sample_with_its_attempts_metadata_and_its_own():
    tree = TrajectoryTree()
    tree.add(Turn([1, 2, 3], [10, 11], [-0.5, -0.25], "stop", weight_version=4))
    tree.add(Turn([1, 2, 3, 10, 11, 20], [12], [-0.125], "length", ill_formed=True, weight_version=5))
    [chain] = tree.samples()
    sample = chain.to_sample(reward=1.0, group_index=2, attempt=3, metadata=ATTEMPT)
    assert sample.tokens.tolist() == [1, 2, 3, 10, 11, 20, 12] and sample.tokens.dtype == np.int32
    assert sample.loss_mask.tolist() == [1, 1, 0, 1] and sample.rollout_log_probs.tolist() == [-0.5, -0.25, 0, -0.125]
    assert sample.token_versions.tolist() == [4, 4, -1, 5]     # which weights wrote each token: 20 is a tool's
    assert (sample.reward, sample.group_index, sample.attempt, sample.prompt_length) == (1.0, 2, 3, 3)
    md = sample.metadata
    assert md.model_dump(include=set(AttemptMetadata.model_fields)) == ATTEMPT.model_dump()
    assert (md.chain_turns, md.trained_tokens, md.weight_version, md.truncated, md.ill_formed_turns) == \
        (2, 3, 5, True, 1)
    assert chain.to_json()["weight_versions"] == (4, 5) and chain.to_json()["tokens"] == sample.tokens.tolist()
