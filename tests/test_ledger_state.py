"""The ledger's pure state logic (hpc.ledger_state): a claiming worker's bookkeeping, without files."""

import random
from itertools import islice

import hypothesis.strategies as st
from hypothesis import given

from hpc.ledger_state import PROBES, Fresh, Spec, Unfinished, open_claims, unclaimed

SPEC = Spec(groups=(3, 5, 9), attempts=4, max_tries=2)


def test_key_at_counts_through_the_keys_in_order():
    assert [SPEC.key_at(i) for i in range(SPEC.size)] == list(SPEC.keys())


def test_unclaimed_are_the_attempts_without_any_try():
    names = ["0-0-0", "0-1-2", "1-1-0", ".1-0-0.tmp-host-1-ab", "11-0-0", "stranger"]
    assert unclaimed(Spec((0, 1), 2, 3), names) == [(1, 0)]


def test_fresh_guesses_until_it_misses_probes_times_in_a_row_then_asks_for_a_listing():
    fresh = Fresh(SPEC, random.Random(0))
    fresh.start()
    for _ in range(3 * PROBES):            # hits reset the count of misses
        assert fresh.next() in set(SPEC.keys())
        fresh.miss()
        fresh.hit()
    for _ in range(PROBES):
        assert fresh.next() is not None
        fresh.miss()
    assert fresh.next() is None


def test_fresh_walks_its_listing_and_lists_again_when_it_runs_dry_or_goes_stale():
    fresh = Fresh(SPEC, random.Random(0))
    fresh.start()
    keys = [(3, 0), (5, 1), (9, 3)]
    fresh.listed(list(keys))
    assert sorted(fresh.next() for _ in keys) == keys and fresh.next() is None   # dry
    fresh.listed([(3, 1)] * (PROBES + 2))
    for _ in range(PROBES + 1):            # listed in this call: every miss is another worker's claim, walk on
        assert fresh.next() == (3, 1)
        fresh.miss()
    fresh.start()                          # a later call: the list is stale after PROBES misses
    assert fresh.next() is None
    fresh.listed([])
    assert fresh.exhausted


def test_unfinished_keeps_the_newest_try_of_what_is_not_committed():
    claims = ["3-0-0", "3-0-1", "3-1-0", "5-0-0", "33-1-0"]
    assert open_claims(claims, ["3-1", "5-0-0"]) == ["3-0-0", "3-0-1", "5-0-0", "33-1-0"]
    left = Unfinished([(3, 0, 0), (3, 0, 1), (5, 0, 0)], rng=random.Random(0))
    assert left.tries == {(3, 0): 1, (5, 0): 0} and len(left) == 2


def test_unfinished_learns_of_fails_of_the_newest_try_or_a_newer_one():
    left = Unfinished([(3, 0, 1), (5, 0, 0), (9, 0, 0)], rng=random.Random(0))
    failed = left.failed([(3, 0, 0), (5, 0, 0), (9, 0, 1), (9, 0, 2), (7, 0, 0)])
    # (3, 0)'s fail is of an older try; (9, 0)'s tries 1 and 2 were claimed since; (7, 0) is not its business
    assert sorted(failed) == [(5, 0), (9, 0)] and left.tries == {(3, 0): 1, (5, 0): 0, (9, 0): 2}


@given(n_keys=st.integers(0, 60), n=st.integers(1, 10), seed=st.integers(0, 2**16),
       drops=st.lists(st.tuples(st.integers(0, 59), st.integers(0, 5)), max_size=30))
def test_unfinished_samples_every_attempt_left_within_len_over_n_calls(n_keys, n, seed, drops):
    """What bounds the time to find an expired lease: looking at n attempts per claim, a worker looks at every
    attempt it still counts as unfinished within ceil(len / n) claims, however many were dropped before; and
    a claim that stops early (it found one) leaves the rest for the next."""
    left = Unfinished([(k, 0, 0) for k in range(n_keys)], rng=random.Random(seed))
    for key, calls in drops:               # some dropped, between some calls
        left.drop((key, 0))
        for _ in range(calls):
            assert len(set(islice(left.sample(), n))) == min(n, len(left))
    seen = set()
    for _ in range(-(-len(left) // n)):
        seen |= set(islice(left.sample(), n))
    assert seen == set(left.tries)


def test_a_sample_stopped_early_goes_on_from_where_it_stopped():
    left = Unfinished([(k, 0, 0) for k in range(10)], rng=random.Random(1))
    first = next(left.sample())            # a claim that took the first attempt it looked at
    rest = list(islice(left.sample(), 9))
    assert sorted([first, *rest]) == [(k, 0) for k in range(10)]
