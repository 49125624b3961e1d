import itertools
import time

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from agentrl.adapter.trajectory import Chain, Drift, TrajectoryTree, Turn, TurnSpan
from agentrl.sample import AttemptMetadata

SYSTEM = [1, 2, 3]


def logprob(token: int) -> float:
    return -token / 1e6     # each sampled token carries its own logprob: a misplaced one shows


def turn(prompt, output, finish_reason="stop", **kw) -> Turn:
    return Turn(list(prompt), list(output), [logprob(t) for t in output], finish_reason, **kw)


def held(t: Turn) -> list[int]:
    return [*t.prompt_ids.tolist(), *t.output_ids.tolist()]


def trained(sample: Chain) -> list[tuple[int, int, float]]:
    """(position in tokens, token, logprob) of each mask-1 token."""
    return [(sample.prompt_length + i, sample.tokens[sample.prompt_length + i], lp)
            for i, (m, lp) in enumerate(zip(sample.loss_mask, sample.rollout_log_probs, strict=True)) if m]


def outputs_at_place(*turns: Turn) -> list[tuple[int, int, float]]:
    """Where each turn's sampled tokens sit in any sequence that holds them."""
    return [(len(t.prompt_ids) + j, tok, logprob(tok)) for t in turns for j, tok in enumerate(t.output_ids.tolist())]


def chain(n: int, first_output=1000) -> list[Turn]:
    """n turns, each prompt = the previous prompt + output + a tool result."""
    turns, prompt = [], [*SYSTEM, 10, 11]
    for i in range(n):
        output = list(range(first_output + 10 * i, first_output + 10 * i + 4))
        turns.append(turn(prompt, output, weight_version=i, meta={"call": i}))
        prompt = [*prompt, *output, 500 + i, 501 + i]
    return turns


def build(turns, **kw) -> tuple[TrajectoryTree, list[Drift]]:
    tree = TrajectoryTree(**kw)
    return tree, [tree.add(t) for t in turns]


def test_turn_validates_and_freezes_its_arrays():
    with pytest.raises(ValueError, match="2 output ids but 1 logprobs"):
        Turn([1], [5, 6], [-0.1], "stop")
    with pytest.raises(ValueError, match="empty prompt"):
        Turn([], [5], [-0.1], "stop")
    with pytest.raises(ValueError, match="flat"):
        Turn([[1, 2]], [5], [-0.1], "stop")
    t = turn([1, 2], [5])
    with pytest.raises(ValueError):
        t.prompt_ids[0] = 9


def test_clean_chain_is_one_sample_training_exactly_the_sampled_tokens():
    turns = chain(5)
    tree, drifts = build(turns)
    assert drifts == [Drift.ROOT] + [Drift.CLEAN] * 4
    assert tree.counts == {Drift.ROOT: 1, Drift.CLEAN: 4, Drift.REALIGN: 0, Drift.FORK: 0}
    assert (tree.turns, tree.chains, tree.branches) == (5, 1, 0)
    [s] = tree.samples()
    assert s.tokens == held(turns[-1])
    assert s.prompt_length == len(turns[0].prompt_ids)
    assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length == len(s.tokens) - s.prompt_length
    assert trained(s) == outputs_at_place(*turns)
    assert s.trained_tokens == sum(s.loss_mask) == sum(len(t.output_ids) for t in turns)
    assert all(lp == 0.0 for m, lp in zip(s.loss_mask, s.rollout_log_probs, strict=True) if not m)
    assert (s.turns, s.weight_versions, s.finish_reason, s.truncated) == (5, (0, 4), "stop", False)
    assert s.metas == tuple({"call": i} for i in range(5))
    # Each sampled token carries its turn's weight version; prompt and tool tokens none (-1)
    versions = {(pos, tok): s.token_versions[pos - s.prompt_length] for pos, tok, _ in trained(s)}
    assert versions == {(len(t.prompt_ids) + j, tok): i for i, t in enumerate(turns)
                        for j, tok in enumerate(t.output_ids.tolist())}
    assert all(v == -1 for m, v in zip(s.loss_mask, s.token_versions, strict=True) if not m)


def test_realign_at_the_end_of_a_response_keeps_one_sample():
    a, b, c = chain(3)
    # c's history re-tokenizes b's last two tokens as one (1012, 1013 -> 7777)
    c_prompt = [*b.prompt_ids.tolist(), 1010, 1011, 7777, 600]
    c = turn(c_prompt, [1020, 1021])
    tree, drifts = build([a, b, c])
    assert drifts == [Drift.ROOT, Drift.CLEAN, Drift.REALIGN]
    assert (tree.chains, tree.branches) == (1, 0)
    [s] = tree.samples()
    assert s.tokens == held(c)
    b_kept = outputs_at_place(b)[:2]
    assert trained(s) == outputs_at_place(a) + b_kept + outputs_at_place(c)
    assert s.trained_tokens == 4 + 2 + 2


@pytest.mark.parametrize(("dropped", "window", "expected"), [
    (4, 4, Drift.REALIGN), (5, 4, Drift.FORK), (1, 0, Drift.FORK), (8, 32, Drift.REALIGN),
])
def test_realign_window_bounds_the_untrained_tail(dropped, window, expected):
    a = turn(SYSTEM, range(1000, 1008))
    b = turn([*SYSTEM, *range(1000, 1008 - dropped), 9999], [2000])
    tree, drifts = build([a, b], realign_window=window)
    assert drifts == [Drift.ROOT, expected]
    samples = tree.samples()
    if expected is Drift.REALIGN:
        assert [trained(s) for s in samples] == [outputs_at_place(a)[:8 - dropped] + outputs_at_place(b)]
    else:
        assert [trained(s) for s in samples] == [outputs_at_place(a), outputs_at_place(b)]
        assert samples[1].prompt_length == len(b.prompt_ids)


def test_early_divergence_in_a_chain_branches_under_the_last_turn_it_matches():
    a, b = chain(2)
    c = turn([*b.prompt_ids.tolist(), 1010, 5555, 600], [3000])  # b's output drifts 3 tokens before its end
    tree, drifts = build([a, b, c], realign_window=2)
    assert drifts == [Drift.ROOT, Drift.CLEAN, Drift.CLEAN]
    assert (tree.chains, tree.branches) == (2, 1)
    first, second = tree.samples()
    assert trained(first) == outputs_at_place(a, b)
    assert trained(second) == outputs_at_place(c)   # a's tokens are there, at mask 0
    assert second.tokens[:len(held(a))] == held(a)


def test_a_turn_with_children_is_never_truncated_so_contradicting_it_forks():
    a, b = chain(2)
    c = turn([*a.prompt_ids.tolist(), 1000, 1001, 1002, 7777], [3000])   # a's last token, re-rendered
    tree, drifts = build([a, b, c])
    assert drifts == [Drift.ROOT, Drift.CLEAN, Drift.FORK]
    first, second = tree.samples()
    assert trained(first) == outputs_at_place(a, b)     # b's chain still trains all of a
    assert trained(second) == outputs_at_place(c)
    assert second.prompt_length == len(c.prompt_ids)


def test_sub_agent_branch_from_the_middle_trains_the_trunk_once():
    a, b, c, d = chain(4)
    e = turn([*held(b), 8000, 8001], [4000, 4001], weight_version=9)
    tree, drifts = build([a, b, c, d, e])
    assert drifts[-1] is Drift.CLEAN
    assert (tree.chains, tree.branches) == (2, 1)
    main, sub = tree.samples()
    assert main.tokens == held(d) and sub.tokens == held(e)
    assert trained(main) == outputs_at_place(a, b, c, d)
    assert trained(sub) == outputs_at_place(e)
    assert sub.turns == 3 and sub.weight_versions == (9, 9)     # versions of the turns it trains


def test_a_retried_call_is_a_second_child_and_what_follows_continues_the_retry():
    a, b = chain(2)
    b_retry = turn(b.prompt_ids, [1110, 1111, 1112])
    c = turn([*held(b_retry), 700], [1200])
    tree, drifts = build([a, b, b_retry, c])
    assert drifts == [Drift.ROOT, Drift.CLEAN, Drift.CLEAN, Drift.CLEAN]
    assert (tree.chains, tree.branches) == (2, 1)
    first, second = tree.samples()
    assert trained(first) == outputs_at_place(a, b)
    assert trained(second) == outputs_at_place(b_retry, c)


def test_retrying_the_first_call_forks():
    a = turn(SYSTEM, [1000, 1001])
    tree, drifts = build([a, turn(SYSTEM, [1002])])
    assert drifts == [Drift.ROOT, Drift.FORK]
    assert [trained(s) for s in tree.samples()] == [outputs_at_place(a), [(3, 1002, logprob(1002))]]


def test_compaction_that_keeps_only_the_system_prompt_forks():
    turns = chain(3)
    summary = turn([*SYSTEM, 900, 901], [5000])
    tree, drifts = build([*turns, summary])
    assert drifts[-1] is Drift.FORK
    assert tree.counts[Drift.FORK] == 1 and tree.chains == 2
    first, second = tree.samples()
    assert trained(first) == outputs_at_place(*turns)
    assert (second.prompt_length, trained(second)) == (5, outputs_at_place(summary))


def test_chains_with_nothing_left_to_train_are_dropped_and_counted():
    a, b = chain(2)
    empty_retry = turn(b.prompt_ids, [], finish_reason="length")
    tree, _ = build([a, b, empty_retry])
    samples = tree.samples()
    assert tree.chains - len(samples) == 1
    assert [s.tokens for s in samples] == [held(b)]


def test_sample_metadata_describes_the_turns_it_trains():
    a = turn(SYSTEM, [1000], ill_formed=True, weight_version=3)
    b = turn([*held(a), 50], [1001], finish_reason="length", weight_version=5)
    c = turn([*held(a), 60], [1002])
    tree, _ = build([a, b, c])
    first, second = tree.samples()
    assert (first.ill_formed_turns, first.weight_versions, first.truncated) == (1, (3, 5), True)
    assert (second.ill_formed_turns, second.weight_versions, second.truncated) == (0, None, False)


def test_spans_say_where_each_turn_of_a_chain_is_and_how_it_mounted():
    """What agentrl view shows of drift: a realign's cut, a fork's new sample, a branch's shared trunk."""
    a, b, c = chain(3)
    c = turn([*b.prompt_ids.tolist(), 1010, 1011, 7777, 600], [1020, 1021])     # realigns b (kept 2 of 4)
    d = turn([*b.prompt_ids.tolist(), 1010, 1011, 7777, 601], [1030])          # a second child of b: a branch
    e = turn([*SYSTEM, 900], [5000], weight_version=7)                          # continues nothing: a fork
    tree, drifts = build([a, b, c, d, e])
    assert drifts == [Drift.ROOT, Drift.CLEAN, Drift.REALIGN, Drift.CLEAN, Drift.FORK]
    main, branch, fork = tree.samples()
    start = len(a.prompt_ids)
    assert main.spans == (
        TurnSpan(0, 4, 4, "root", True, 0),
        TurnSpan(len(b.prompt_ids) - start, 4, 2, "clean", True, 1),
        TurnSpan(len(c.prompt_ids) - start, 2, 2, "realign", True, None))
    assert [(s.drift, s.trained) for s in branch.spans] == [("root", False), ("clean", False), ("clean", True)]
    assert fork.spans == (TurnSpan(0, 1, 1, "fork", True, 7),)
    for sample in (main, branch, fork):     # a trained span's kept tokens are exactly the sample's mask-1 tokens
        marked = [i for i, m in enumerate(sample.loss_mask) if m]
        assert marked == [s.start + j for s in sample.spans if s.trained for j in range(s.kept)]


def test_hundreds_of_clean_turns_over_100k_tokens_add_quickly():
    tree, prompt, elapsed = TrajectoryTree(), list(range(2000)), 0.0
    for i in range(300):
        output = list(range(10**6 + 100 * i, 10**6 + 100 * i + 100))
        t = Turn(prompt, output, [-0.5] * 100, "tool_calls")
        started = time.perf_counter()
        assert tree.add(t) is (Drift.CLEAN if i else Drift.ROOT)
        elapsed += time.perf_counter() - started
        prompt = [*prompt, *output, *range(50_000, 50_230)]
    assert len(prompt) > 100_000
    assert elapsed < 10, f"{elapsed:.1f} s for 300 adds"
    [s] = tree.samples()
    assert s.trained_tokens == 300 * 100


# --- random sessions -----------------------------------------------------------------------------------------------

WINDOW = 4
OPS = st.lists(st.tuples(st.sampled_from(["fresh", "continue", "drift", "cut", "retry"]),
                         st.integers(0, 10**6), st.integers(1, 6), st.integers(0, 8)), min_size=1, max_size=25)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_random_sessions_train_every_kept_token_once_in_place(ops):
    fresh = itertools.count(100)
    tree, turns, drifts = TrajectoryTree(realign_window=WINDOW), [], []
    for kind, pick, k, out_len in ops:
        base = turns[pick % len(turns)] if turns else None
        if base is None or kind == "fresh":
            prompt = [*SYSTEM, next(fresh)]
        elif kind == "continue":
            prompt = [*held(base), next(fresh)]
        elif kind == "drift":
            prompt = [*base.prompt_ids.tolist(), *base.output_ids.tolist()[:-k], next(fresh)]
        elif kind == "cut":
            prompt = held(base)[:pick % (len(held(base)) + 1)] + [next(fresh) for _ in range(k)]
        else:
            prompt = base.prompt_ids.tolist()
        turns.append(turn(prompt, [next(fresh) for _ in range(out_len)]))
        drifts.append(tree.add(turns[-1]))
        if kind == "continue" and base is not None:
            assert drifts[-1] is Drift.CLEAN
        if kind == "fresh" or base is None:
            assert drifts[-1] is (Drift.FORK if len(turns) > 1 else Drift.ROOT)

    counts = tree.counts
    assert counts == {d: drifts.count(d) for d in Drift} and counts[Drift.ROOT] == 1
    assert tree.chains == counts[Drift.ROOT] + counts[Drift.FORK] + tree.branches

    samples = tree.samples()
    leaves = [s.tokens for s in samples]
    assert all(any(tokens == held(t) for t in turns) for tokens in leaves)
    sampled_at = {(place, tok): lp for place, tok, lp in outputs_at_place(*turns)}
    turn_of = {tok: i for i, t in enumerate(turns) for tok in t.output_ids.tolist()}
    kept = [0] * len(turns)
    seen = set()
    for s in samples:
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length >= 0
        assert s.trained_tokens == sum(s.loss_mask) > 0
        assert all(lp == 0.0 for m, lp in zip(s.loss_mask, s.rollout_log_probs, strict=True) if not m)
        for place, tok, lp in trained(s):
            assert sampled_at.get((place, tok)) == lp, "a trained token that was not sampled there"
            assert tok not in seen, "a sampled token trained twice"
            seen.add(tok)
            kept[turn_of[tok]] += 1
    for i, t in enumerate(turns):    # what a turn trains is a prefix of its output: see trained() order
        assert {tok for tok in t.output_ids.tolist() if tok in seen} == set(t.output_ids.tolist()[:kept[i]])
    lost = [len(t.output_ids) - kept[i] for i, t in enumerate(turns)]
    assert sum(n > 0 for n in lost) <= counts[Drift.REALIGN]
    assert all(n <= WINDOW for n in lost)


def routed(prompt, output, start, **kw) -> Turn:
    """A turn with an MoE's routes as a server sends them, positions [start, seqlen - 1): each row holds its
    position and the token there, so a row in the wrong place, or of other tokens, shows."""
    seq = [*prompt, *output]
    rows = np.array([[p, seq[p]] for p in range(start, len(seq) - 1)], dtype=np.int16).reshape(-1, 2)
    return turn(prompt, output, routes=rows, routes_start=start, **kw)


@pytest.mark.parametrize("realign", [False, True])
def test_each_turn_asks_for_the_routes_its_chain_lacks_and_the_sample_has_every_fed_positions(realign):
    a, b, c = chain(3)
    c_prompt = [*b.prompt_ids.tolist(), 1010, 1011, 7777, 600] if realign else c.prompt_ids.tolist()
    tree = TrajectoryTree()
    starts = []
    for t in (a, b, turn(c_prompt, [1020, 1021])):
        start = tree.routes_start(t.prompt_ids)
        starts.append(start)
        tree.add(routed(t.prompt_ids.tolist(), t.output_ids.tolist(), start))
    # a root asks from 0; a clean turn from its parent's last output token (never fed); a REALIGN from the last
    # token the parent keeps, as the re-rendered ones after it are new
    assert starts == [0, len(held(a)) - 1, len(b.prompt_ids) + (2 if realign else 4) - 1]
    [s] = tree.samples()
    assert s.routed_experts is not None and s.routed_experts.shape == (len(s.tokens), 2)
    assert s.routed_experts[:-1].tolist() == [[p, s.tokens[p]] for p in range(len(s.tokens) - 1)]
    assert s.routed_experts[-1].tolist() == [-1, -1]
    sample = s.to_sample(reward=1.0, group_index=0, attempt=0, metadata=AttemptMetadata())
    assert (sample.routed_experts == s.routed_experts).all()


def test_routes_that_do_not_cover_the_turns_positions_are_refused():
    with pytest.raises(ValueError, match=r"routes of shape \(3, 2\) for positions \[0, 6\)"):
        turn([1, 2, 3], [4, 5, 6, 7], routes=np.zeros((3, 2), np.int16))
