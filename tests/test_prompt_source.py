"""Prompt groups per rollout: resumable, each row once per epoch, seeded, fingerprinted; prompt JSONL loading."""

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.prompts.source import (
    PromptDataError,
    PromptSource,
    PromptStateError,
    epoch_permutation,
    load_prompt_rows,
)


def make_rows(n):
    return [{"prompt": f"fix bug {i}", "metadata": {"instance_id": f"task-{i}"}} for i in range(n)]


def ids(rows):
    return [r["metadata"]["instance_id"] for r in rows]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 17), b=st.integers(1, 23), seed=st.integers(0, 2**32), shuffle=st.booleans(),
       resume_at=st.integers(0, 12), data=st.data())
def test_a_resumed_source_continues_the_uninterrupted_sequence(n, b, seed, shuffle, resume_at, data):
    rows = make_rows(n)
    rollouts = max(3 * n // b + 2, resume_at + 1)   # at least three epochs
    long_lived = PromptSource(rows, rollout_batch_size=b, shuffle=shuffle, seed=seed)
    uninterrupted = [ids(long_lived.groups_for_rollout(r)) for r in range(rollouts)]

    state = json.loads(json.dumps(long_lived.state()))       # as a checkpoint stores it
    resumed = PromptSource.from_state(state, make_rows(n))   # equal rows, freshly loaded
    later = data.draw(st.lists(st.integers(resume_at, rollouts - 1), min_size=1, max_size=4))
    assert [ids(resumed.groups_for_rollout(r)) for r in later] == [uninterrupted[r] for r in later]
    assert all(len(batch) == b for batch in uninterrupted)
    assert [resumed.epoch_of(r) for r in later] == [r * b // n for r in later]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 30), b=st.integers(1, 40), seed=st.integers(0, 1000))
def test_every_row_appears_exactly_once_per_epoch(n, b, seed):
    source = PromptSource(make_rows(n), rollout_batch_size=b, seed=seed)
    epochs = 3
    flat = [i for r in range(-(-epochs * n // b)) for i in ids(source.groups_for_rollout(r))]
    for e in range(epochs):
        assert Counter(flat[e * n:(e + 1) * n]) == Counter(ids(make_rows(n)))


def test_batches_straddle_epochs_and_may_exceed_the_data():
    source = PromptSource(make_rows(3), rollout_batch_size=7, seed=5)
    batch = ids(source.groups_for_rollout(1))                # groups 7..13: epochs 2, 3 and 4
    assert len(batch) == 7 and Counter(batch).most_common(1)[0][1] == 3
    assert source.epoch_of(0) == 0 and source.epoch_of(1) == 2
    assert batch[:2] == [f"task-{i}" for i in epoch_permutation(3, 5, 2)[1:]]


def test_unshuffled_is_file_order_and_seeds_differ():
    rows = make_rows(50)
    plain = PromptSource(rows, rollout_batch_size=20, shuffle=False)
    assert ids(plain.groups_for_rollout(0) + plain.groups_for_rollout(1) + plain.groups_for_rollout(2)) == \
        ids(rows) + ids(rows)[:10]
    a, b = (PromptSource(rows, rollout_batch_size=50, seed=s).groups_for_rollout(0) for s in (1, 2))
    assert ids(a) != ids(b) and sorted(ids(a)) == sorted(ids(b))
    epoch0, epoch1 = (ids(PromptSource(rows, rollout_batch_size=50, seed=1).groups_for_rollout(r)) for r in (0, 1))
    assert epoch0 != epoch1            # each epoch is shuffled anew
    assert ids(a) != ids(rows)


def test_the_order_is_pinned_across_library_versions():
    # The permutation is ours (keyed BLAKE2b), so this literal holds on any numpy or Python version;
    # if it changes, checkpoints of running experiments would resume on another order.
    assert epoch_permutation(8, 0, 0) != epoch_permutation(8, 0, 1)
    assert sorted(epoch_permutation(8, 3, 4)) == list(range(8))
    assert epoch_permutation(6, 0, 0) == (2, 1, 4, 5, 0, 3)


def test_resume_on_other_data_or_state_is_refused():
    rows = make_rows(10)
    state = PromptSource(rows, rollout_batch_size=4, seed=9).state()
    edited = make_rows(10)
    edited[3]["prompt"] += " (edited)"
    with pytest.raises(PromptStateError, match="differs from the checkpoint"):
        PromptSource.from_state(state, edited)
    with pytest.raises(PromptStateError, match="differs from the checkpoint"):
        PromptSource.from_state(state, rows[::-1])          # same rows, another order
    with pytest.raises(PromptStateError, match="differs from the checkpoint"):
        PromptSource.from_state(state, make_rows(11))
    with pytest.raises(PromptStateError, match="other code"):
        PromptSource.from_state({**state, "order": "numpy-pcg64"}, rows)
    with pytest.raises(PromptStateError, match="lacks 'seed'"):
        PromptSource.from_state({k: v for k, v in state.items() if k != "seed"}, rows)
    assert PromptSource.from_state(state, make_rows(10)).state() == state


@pytest.mark.parametrize("kwargs, match", [
    ({"rows": []}, "no prompt rows"),
    ({"rollout_batch_size": 0}, "rollout_batch_size"),
    ({"rollout_batch_size": 2.0}, "rollout_batch_size"),
    ({"seed": -1}, "seed"),
])
def test_bad_parameters(kwargs, match):
    args = {"rows": make_rows(3), "rollout_batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        PromptSource(args.pop("rows"), **args)
    with pytest.raises(ValueError, match="rollout must be"):
        PromptSource(make_rows(3), rollout_batch_size=2).groups_for_rollout(-1)


def test_load_prompt_rows_keeps_prompts_verbatim(tmp_path):
    prompt = "  Fix it.\n\n<|im_start|>user is text here\u2028not a line end  "
    rows = [{"prompt": prompt, "metadata": {"instance_id": "a"}}, {"prompt": "b"}]
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1], ensure_ascii=False) + "\n")
    assert load_prompt_rows(path) == rows
    assert load_prompt_rows(path)[0]["prompt"] == prompt


@pytest.mark.parametrize("lines, match", [
    (['{"prompt": "a"}', "{not json"], r"prompts.jsonl:2: not JSON"),
    (['{"prompt": [{"role": "user", "content": "hi"}]}'], r":1: \"prompt\" must be plain text"),
    (['["a"]'], r":1: a row must be a JSON object"),
    (['{"metadata": {}}'], r':1: no "prompt"'),
    (['{"prompt": "  "}'], r":1: \"prompt\" is empty"),
    (['{"prompt": "a"}', "", '{"prompt": "b", "metadata": "x"}'], r":3: \"metadata\" must be an object"),
    (["", "  "], r"prompts.jsonl: no prompt rows"),
])
def test_load_prompt_rows_errors_name_the_line(tmp_path, lines, match):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PromptDataError, match=match):
        load_prompt_rows(path)


def test_load_prompt_rows_refuses_non_utf8(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(PromptDataError, match=r"prompts.jsonl:2: not UTF-8 \(byte 31 of the file\)"):
        load_prompt_rows(path)
