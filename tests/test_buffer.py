import msgpack
import numpy as np
import pytest

from agentrl.sample import SAMPLE_CODEC, Sample, SampleMetadata
from hpc.buffer import read_rollout, read_shard, shard_path, write_shard
from hpc.ledger import Ledger
from hpc.records import RecordError


def sample(group, attempt, n=4, reward=1.0, **meta):
    return Sample(tokens=np.arange(10, 10 + n + 3), response_length=n,
                  loss_mask=np.array([1, 0] * (n // 2) + [1] * (n % 2)),
                  rollout_log_probs=np.linspace(-2, 0, n), reward=reward, status="completed",
                  group_index=group, attempt=attempt, metadata=SampleMetadata(**meta))


def test_shard_round_trip_keeps_tokens_exact(tmp_path):
    led = Ledger(tmp_path / "ledger")
    led.open_rollout(0, [4], 1)
    c = led.claim("w")
    big = Sample(tokens=np.array([0, 151_643, 2**31 - 1]), response_length=1, loss_mask=[1],
                 rollout_log_probs=[-1e-7], reward=0.0, status="truncated", group_index=4, attempt=0,
                 metadata=SampleMetadata(drift={"clean": 3}, harness="builtin"))
    ref = write_shard(tmp_path / "buf", c, [big, sample(4, 0)], SAMPLE_CODEC)
    header, (a, b) = read_shard(tmp_path / "buf" / ref, SAMPLE_CODEC)
    assert header["generation"] == c.generation and header["writer"]["pid"] > 0
    assert a.tokens.tolist() == [0, 151_643, 2**31 - 1] and a.tokens.dtype == np.int32
    assert a.rollout_log_probs.tolist() == [np.float32(-1e-7)]
    assert a.metadata == SampleMetadata(drift={"clean": 3}, harness="builtin") and a.status == "truncated"
    assert b.loss_mask.tolist() == [1, 0, 1, 0]


@pytest.mark.parametrize("kwargs, message", [
    (dict(response_length=9), "response_length 9 is outside"),
    (dict(loss_mask=[1, 1]), "loss_mask has 2 entries"),
    (dict(rollout_log_probs=[0.0]), "rollout_log_probs has 1 entries"),
])
def test_invalid_samples_are_refused(kwargs, message):
    base = dict(tokens=np.arange(6), response_length=3, loss_mask=[1, 1, 1],
                rollout_log_probs=[0.0, 0.0, 0.0], reward=0.0, status="completed", group_index=0, attempt=0)
    with pytest.raises(ValueError, match=message):
        Sample(**{**base, **kwargs})


def test_reader_returns_only_committed_complete_groups_of_the_current_generation(tmp_path):
    led, buf = Ledger(tmp_path / "ledger", seed=0), tmp_path / "buf"
    led.open_rollout(0, [0, 1], 2)
    claims = {(c.group, c.attempt): c for c in iter(lambda: led.claim("w"), None)}
    for key in [(0, 0), (0, 1), (1, 0)]:
        led.commit(claims[key], write_shard(buf, claims[key], [sample(*key, reward=key[1])], SAMPLE_CODEC))
    # (1, 1) wrote its shard but never committed: group 1 is incomplete and not read.
    write_shard(buf, claims[(1, 1)], [sample(1, 1)], SAMPLE_CODEC)
    got = read_rollout(led, buf, 0, SAMPLE_CODEC)
    assert list(got) == [0] and sorted(s.reward for s in got[0]) == [0.0, 1.0]

    # Reopened (a resumed trainer): the old generation's shards are never read.
    led.open_rollout(0, [0, 1], 2)
    assert read_rollout(led, buf, 0, SAMPLE_CODEC) == {}
    for c in iter(lambda: led.claim("w"), None):
        led.commit(c, write_shard(buf, c, [sample(c.group, c.attempt, reward=10)], SAMPLE_CODEC))
    got = read_rollout(led, buf, 0, SAMPLE_CODEC)
    assert sorted(got) == [0, 1] and all(s.reward == 10 for ss in got.values() for s in ss)


def test_every_reader_of_a_closed_rollout_gets_the_groups_its_close_fixed(tmp_path):
    """Issue 15, defect 1: a commit landing between two ranks' reads must not give them different batches."""
    led, buf = Ledger(tmp_path / "ledger", seed=0), tmp_path / "buf"
    led.open_rollout(0, [0, 1, 2], 1)
    claims = {c.group: c for c in iter(lambda: led.claim("w"), None)}
    for g in (0, 1):
        led.commit(claims[g], write_shard(buf, claims[g], [sample(g, 0)], SAMPLE_CODEC))
    closed = led.close_rollout(0)                         # rank 0 decides: groups 0 and 1
    assert closed.groups == [0, 1]
    rank0 = read_rollout(Ledger(tmp_path / "ledger"), buf, 0, SAMPLE_CODEC)
    # Group 2's attempt was in flight at the close; it commits before rank 1 reads.
    assert led.commit(claims[2], write_shard(buf, claims[2], [sample(2, 0)], SAMPLE_CODEC))
    assert led.status(0).complete_groups == [0, 1, 2]
    rank1 = read_rollout(Ledger(tmp_path / "ledger"), buf, 0, SAMPLE_CODEC)
    assert sorted(rank0) == sorted(rank1) == [0, 1]
    # A resumed trainer closing again gets the first decision, not a new one.
    assert led.close_rollout(0).groups == [0, 1] and led.closed(0).groups == [0, 1]


def test_a_shard_that_does_not_match_its_commit_is_refused(tmp_path):
    led, buf = Ledger(tmp_path / "ledger", seed=0), tmp_path / "buf"
    led.open_rollout(0, [0, 1], 1)
    c0, c1 = sorted(iter(lambda: led.claim("w"), None), key=lambda c: c.group)
    led.commit(c0, write_shard(buf, c0, [sample(0, 0)], SAMPLE_CODEC))
    led.commit(c1, write_shard(buf, c0, [sample(0, 0)], SAMPLE_CODEC))   # a worker bug: committed the wrong shard
    with pytest.raises(RecordError, match="but the ledger committed"):
        read_rollout(led, buf, 0, SAMPLE_CODEC)


def test_corrupt_and_foreign_shards_are_refused_naming_the_file(tmp_path):
    led = Ledger(tmp_path / "ledger")
    led.open_rollout(0, [0], 1)
    c = led.claim("w")
    with pytest.raises(ValueError, match="item of group 5"):
        write_shard(tmp_path, c, [sample(5, 0)], SAMPLE_CODEC)
    path = shard_path(tmp_path, c)
    write_shard(tmp_path, c, [sample(0, 0)], SAMPLE_CODEC)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(RecordError, match=f"{path}: is not a readable shard"):
        read_shard(path, SAMPLE_CODEC)
    path.write_bytes(msgpack.packb({"kind": "shard", "schema_version": 99, "samples": []}))
    with pytest.raises(RecordError, match="shard schema 99"):
        read_shard(path, SAMPLE_CODEC)


class ArrayCodec:
    """The least codec: a record is the item itself (a dict), its attempt in two keys."""

    def to_record(self, item: dict) -> dict:
        return item

    def from_record(self, record: dict) -> dict:
        return record

    def attempt_of(self, item: dict) -> tuple[int, int]:
        return item["group"], item["attempt"]


def test_records_keep_arrays_exact_whatever_their_dtype_shape_or_byte_order(tmp_path):
    led = Ledger(tmp_path / "ledger")
    led.open_rollout(0, [0], 1)
    c = led.claim("w")
    arrays = {"i8": np.array([-(2**63), 2**63 - 1]), "u1": np.arange(256, dtype=np.uint8),
              "f8": np.array([np.pi, -0.0, np.inf, np.nan]), "f2": np.array([1e-4], np.float16),
              "bool": np.array([True, False]), "c8": np.array([1 + 2j], np.complex64),
              "grid": np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],        # 2-D, not contiguous
              "big": np.array([1, 258, -3], dtype=">i4"), "empty": np.zeros((0, 3), np.float32)}
    item = {"group": 0, "attempt": 0, "nested": {"list": [np.array([7], np.int64), "text", None]}, **arrays}
    [back] = read_shard(tmp_path / write_shard(tmp_path, c, [item], ArrayCodec()), ArrayCodec())[1]
    for name, a in arrays.items():
        got = back[name]
        assert got.dtype == a.dtype.newbyteorder("<") and got.shape == a.shape, name
        assert got.tobytes() == a.astype(a.dtype.newbyteorder("<")).tobytes(), name    # every bit, NaN's too
    assert back["nested"]["list"][0].tolist() == [7] and back["nested"]["list"][1:] == ["text", None]
    with pytest.raises(TypeError, match="dtype object"):
        write_shard(tmp_path, c, [{"group": 0, "attempt": 0, "x": np.array([None])}], ArrayCodec())
    with pytest.raises(TypeError, match="not float32"):
        write_shard(tmp_path, c, [{"group": 0, "attempt": 0, "x": np.float32(1)}], ArrayCodec())


def test_a_shard_of_the_old_schema_is_refused_by_name(tmp_path):
    """Schema 1 held hpc's own sample type (arrays as raw bytes beside their names): read as such, never guessed."""
    led = Ledger(tmp_path / "ledger")
    led.open_rollout(0, [0], 1)
    c = led.claim("w")
    path = shard_path(tmp_path, c)
    path.parent.mkdir(parents=True)
    old = {"tokens": np.arange(3, dtype="<i4").tobytes(), "response_length": 1, "loss_mask": b"\x01",
           "rollout_log_probs": np.zeros(1, "<f4").tobytes(), "reward": 1.0, "status": "completed",
           "group_index": 0, "attempt": 0, "metadata": {}}
    path.write_bytes(msgpack.packb({"kind": "shard", "schema_version": 1, "rollout_id": 0, "generation": c.generation,
                                    "group": 0, "attempt": 0, "try_index": c.try_index, "writer": {},
                                    "samples": [old]}, use_bin_type=True))
    led.commit(c, str(path.relative_to(tmp_path)))
    with pytest.raises(RecordError, match=f"{path}: has shard schema 1; this agentrl-hpc reads 2. an older "
                                          "agentrl-hpc wrote it: reopen the rollout"):
        read_rollout(led, tmp_path, 0, SAMPLE_CODEC)
