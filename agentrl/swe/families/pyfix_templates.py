"""The pyfix family's function templates: the fixed code, and the bugs each can be given.

A template is a function of a `random.Random` that draws its constants and the calls that
become tests, and returns a Spec. Its source is a `string.Template` ($fn is the function's
name; the other $NAMES are its constants). Each Bug replaces one piece of the fixed source
(`old`, found exactly once) with `new`. Its `triggers` are calls whose result the bug changes
(the first one goes into the instruction), its `normals` calls it leaves alone (the
template's, unless it names its own). pyfix.py runs both versions on every call and refuses
a draw where either list is wrong, so a template cannot claim what its code does not do.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("off-by-one", "comparison", "constant", "swapped", "edge-case")


@dataclass(frozen=True)
class Bug:
    kind: str
    old: str
    new: str
    note: str                          # why the expected result is right, for the instruction
    triggers: list[tuple]              # argument tuples the bug changes; the first is the instruction's
    normals: list[tuple] | None = None  # argument tuples it leaves alone, when not the template's


@dataclass(frozen=True)
class Spec:
    template: str
    names: tuple[str, ...]             # the function's possible names
    modules: tuple[str, ...]           # its module's possible names
    source: str
    consts: dict
    normals: list[tuple]
    bugs: list[Bug]


def _ints(rng, k, lo, hi, avoid=()):
    """k distinct integers from lo..hi, none of `avoid`."""
    return rng.sample([v for v in range(lo, hi + 1) if v not in avoid], k)


def _mix(rng, *parts):
    out = [v for p in parts for v in p]
    rng.shuffle(out)
    return out


def _nums(rng, k):
    return [rng.randint(0, 99) for _ in range(k)]


COUNT_IN_RANGE = '''\
"""Counting values by range."""


def $fn(values, lo, hi):
    """How many of `values` lie in lo..hi, both bounds inclusive."""
    count = 0
    for v in values:
        if v >= lo and v <= hi:
            count += 1
    return count
'''


def count_in_range(rng) -> Spec:
    lo = rng.randint(-10, 20)
    hi = lo + rng.randint(4, 25)
    v = rng.randint(-10, 40)

    def inside(k):
        return _ints(rng, k, lo + 1, hi - 1)

    def outside(k):
        return rng.sample([*range(lo - 15, lo), *range(hi + 1, hi + 16)], k)
    note = "both bounds are inclusive"
    return Spec("count_in_range", ("count_in_range", "count_between", "count_within", "tally_in_range"),
                ("ranges", "counting", "filters"), COUNT_IN_RANGE, {},
                [(_mix(rng, inside(2), outside(2)), lo, hi), (outside(3), lo, hi), ([], lo, hi)], [
        Bug("comparison", "v <= hi", "v < hi", note,
            [(_mix(rng, [hi], inside(2), outside(1)), lo, hi), (_mix(rng, [hi, hi], inside(1)), lo, hi)]),
        Bug("comparison", "v >= lo", "v > lo", note,
            [(_mix(rng, [lo], inside(2), outside(1)), lo, hi), (_mix(rng, [lo, lo], inside(1)), lo, hi)]),
        Bug("swapped", "v >= lo and v <= hi", "v >= hi and v <= lo", "it counts the values from lo to hi",
            [(_mix(rng, inside(3), outside(1)), lo, hi), (_mix(rng, inside(1), [lo]), lo, hi)],
            [(outside(3), lo, hi), ([], lo, hi), (_mix(rng, [v, v], [v + 3]), v, v)]),
    ])


CLAMP = '''\
"""Keeping numbers within bounds."""


def $fn(x, lo=$LO, hi=$HI):
    """x limited to lo..hi: lo when x is below it, hi when x is above it."""
    if lo > hi:
        raise ValueError(f"empty range {lo}..{hi}")
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x
'''


def clamp(rng) -> Spec:
    lo = rng.randint(0, 10)
    hi = lo + rng.randint(20, 200)
    hi2 = hi + rng.choice([-1, 1]) * rng.randint(5, 15)
    v = rng.randint(-5, 50)

    def mid():
        return rng.randint(lo + 1, hi - 1)

    def d():
        return rng.randint(1, 9)
    a, b = sorted((hi, hi2))
    return Spec("clamp", ("clamp", "clip", "bound", "limit_to"), ("bounds", "limits", "clamping"), CLAMP,
                {"LO": lo, "HI": hi},
                [(mid(), lo, hi), (lo - d(), lo, hi), (hi + d(), lo, hi), (mid(),)], [
        Bug("comparison", "if lo > hi", "if lo >= hi", "a range with lo == hi holds that one value",
            [(v + rng.choice([-1, 1]) * rng.randint(1, 20), v, v), (v, v, v)]),
        Bug("swapped", "return lo\n    if x > hi:\n        return hi", "return hi\n    if x > hi:\n        return lo",
            "below lo gives lo, above hi gives hi", [(lo - d(),), (hi + d(), lo, hi)],
            [(mid(), lo, hi), (mid(),), (lo, lo, hi)]),
        Bug("constant", "hi=$HI", f"hi={hi2}", f"the default upper bound is {hi}",
            [(b + d(),), (a + rng.randint(1, b - a - 1),)], [(mid(), lo, hi), (lo - d(),), (hi + d(), lo, hi)]),
    ])


LAST_N = '''\
"""Taking the end of a sequence."""


def $fn(items, n):
    """The last n items of `items` as a list (all of them when n is larger); [] when n is 0."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n == 0:
        return []
    return list(items[-n:])
'''


def last_n(rng) -> Spec:
    a, b = _nums(rng, rng.randint(4, 8)), _nums(rng, rng.randint(4, 8))
    note = "n == 0 asks for no items"
    return Spec("last_n", ("last_n", "tail", "take_last", "newest"), ("seqs", "listing", "tails"), LAST_N, {},
                [(a, rng.randint(1, len(a))), (b, len(b) + rng.randint(1, 3)), (a, -rng.randint(1, 3))], [
        Bug("edge-case", "    if n == 0:\n        return []\n", "", note, [(a, 0), (b, 0)]),
        Bug("comparison", "n < 0", "n <= 0", note, [(a, 0), (b, 0)]),
        Bug("off-by-one", "items[-n:]", "items[-n + 1:]", "it returns the last n items",
            [(a, rng.randint(2, len(a))), (b, 1)],
            [(a, 0), (b, len(b) + rng.randint(1, 3)), (a, -rng.randint(1, 3))]),
    ])


SAFE_DIV = '''\
"""Division that does not fail on zero."""


def $fn(a, b, default=$D):
    """a / b, or `default` when b is 0."""
    if b == 0:
        return default
    return a / b
'''


def safe_div(rng) -> Spec:
    d = rng.randint(-3, 3)
    d2 = d + rng.choice([-1, 1]) * rng.randint(1, 3)
    e = rng.randint(4, 9)
    v = rng.randint(1, 9)

    def q(big=False):
        b = rng.choice([n for n in range(-9, 10) if n])
        return b * rng.choice([k for k in range(-9, 10) if not big or abs(k) > 1]), b

    def x():
        return rng.randint(1, 50)
    return Spec("safe_div", ("safe_div", "divide", "ratio_or", "div_or_default"), ("arith", "division", "ratios"),
                SAFE_DIV, {"D": d}, [q(), (x(), 0, e), (v, v)], [
        Bug("swapped", "return a / b", "return b / a", "it divides a by b", [q(True), q(True)],
            [(x(), 0), (x(), 0, e), (v, v), (-v, v)]),
        Bug("edge-case", "    if b == 0:\n        return default\n", "", f"b == 0 gives the default, {d}",
            [(x(), 0), (x(), 0, e)], [q(), q(), (v, v)]),
        Bug("constant", "default=$D", f"default={d2}", f"the default is {d}", [(x(), 0), (x(), 0)],
            [q(), (x(), 0, e), (v, v)]),
    ])


FIRST_INDEX = '''\
"""Finding items in a list."""


def $fn(items, target):
    """The index of the first item equal to `target`, or -1 when there is none."""
    for i in range(len(items)):
        if items[i] == target:
            return i
    return -1
'''


def first_index(rng) -> Spec:
    a, b = _ints(rng, rng.randint(4, 8), 0, 99), _ints(rng, rng.randint(4, 8), 0, 99)
    absent = _ints(rng, 1, 0, 99, avoid=a)[0]
    return Spec("first_index", ("first_index", "index_of", "find_first", "position"), ("search", "lookup", "finders"),
                FIRST_INDEX, {},
                [(a, a[rng.randint(1, len(a) - 2)]), (b, b[rng.randint(1, len(b) - 2)]), (a, absent), ([], absent)], [
        Bug("off-by-one", "range(len(items))", "range(1, len(items))", "the first item has index 0",
            [(a, a[0]), (b, b[0])]),
        Bug("off-by-one", "range(len(items))", "range(len(items) - 1)", "the last item counts too",
            [(a, a[-1]), (b, b[-1])]),
        Bug("constant", "return -1", f"return {rng.choice([0, None])}", "-1 means not found",
            [(a, absent), ([], absent)], [(a, a[rng.randint(0, len(a) - 1)]), (b, b[rng.randint(0, len(b) - 1)])]),
    ])


SUM_MULTIPLES = '''\
"""Sums over a list."""


def $fn(values, k=$K):
    """The sum of the numbers in `values` that are multiples of k."""
    if k == 0:
        raise ValueError("k must not be 0")
    total = 0
    for v in values:
        if v % k == 0:
            total += v
    return total
'''


def sum_multiples(rng) -> Spec:
    k = rng.randint(3, 9)
    k2 = k + rng.choice([-1, 1])
    mults = [m for m in range(k + 1, 100) if m % k == 0 and m % k2]
    fillers = [m for m in range(k + 1, 100) if m % k and m % k2]

    def values(nm, nf):
        return _mix(rng, rng.sample(mults, nm), rng.sample(fillers, nf))
    return Spec("sum_multiples", ("sum_multiples", "sum_divisible", "total_of_multiples"), ("sums", "totals"),
                SUM_MULTIPLES, {"K": k}, [(values(2, 2), k), ([],), ([k, k], k), (values(0, 3), k)], [
        Bug("constant", "k=$K", f"k={k2}", f"k is {k} unless given", [(values(2, 2),), (values(1, 1),)],
            [(values(2, 2), k), ([],), (values(2, 1), k2)]),
        Bug("swapped", "v % k", "k % v", "it sums the multiples of k", [(values(2, 2), k), (values(1, 2),)],
            [([],), ([k, k], k), (values(0, 3), k)]),
        Bug("edge-case", '    if k == 0:\n        raise ValueError("k must not be 0")\n', "", "k must not be 0",
            [([], 0), (values(1, 1), 0)], [(values(2, 2), k), ([],), ([k, k], k)]),
    ])


MEAN = '''\
"""Averages."""


def $fn(values):
    """The arithmetic mean of `values`; $EMPTY for an empty list."""
    if not values:
        return $EMPTY
    return sum(values) / len(values)
'''


def mean(rng) -> Spec:
    empty, wrong = rng.choice([(0.0, None), (None, 0.0)])

    def nice():
        n, m = rng.randint(2, 5), rng.randint(2, 20)
        head = _nums(rng, n - 1)
        return _mix(rng, head, [m * n - sum(head)])
    return Spec("mean", ("mean", "average", "mean_of", "avg"), ("stats", "averages", "summary"), MEAN,
                {"EMPTY": empty}, [(nice(),), (nice(),), ([1] * rng.randint(2, 5),)], [
        Bug("edge-case", "    if not values:\n        return $EMPTY\n", "", f"an empty list gives {empty}", [([],)]),
        Bug("constant", "return $EMPTY", f"return {wrong}", f"an empty list gives {empty}", [([],)]),
        Bug("swapped", "sum(values) / len(values)", "len(values) / sum(values)", "the mean is the sum over the count",
            [(nice(),), (nice(),)], [([],), ([1] * rng.randint(2, 5),), ([-1] * rng.randint(2, 5),)]),
    ])


CHUNK = '''\
"""Cutting lists into pieces."""


def $fn(items, size):
    """`items` cut into lists of `size` items, in order; the last one may be shorter."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    out = []
    for start in range(0, len(items), size):
        out.append(list(items[start:start + size]))
    return out
'''


def chunk(rng) -> Spec:
    def cut(size, rest):
        return _nums(rng, size * rng.randint(1, 3) + rest), size
    return Spec("chunk", ("chunk", "batches", "split_every", "in_groups"), ("batching", "chunks", "grouping"), CHUNK,
                {}, [cut(rng.randint(2, 4), 0), ([], rng.randint(2, 4)), (_nums(rng, 3), 0)], [
        Bug("off-by-one", "items[start:start + size]", "items[start:start + size - 1]", "each list has size items",
            [cut(rng.randint(2, 4), rng.randint(0, 1)), cut(1, 1)],
            [([], rng.randint(2, 4)), (_nums(rng, 3), 0), (_nums(rng, 2), -rng.randint(1, 3))]),
        Bug("comparison", "size < 1", "size <= 1", "size 1 gives lists of one item",
            [cut(1, rng.randint(1, 3)), cut(1, 0)]),
        Bug("off-by-one", "range(0, len(items), size)", "range(0, len(items) - 1, size)",
            "the last list may be shorter but is never dropped",
            [cut(rng.randint(2, 4), 1), cut(rng.randint(2, 4), 1)],
            [cut(rng.randint(2, 4), 0), cut(rng.randint(3, 4), 2), ([], rng.randint(2, 4))]),
    ])


RANGE_SUM = '''\
"""Sums of runs of integers."""


def $fn(lo, hi):
    """The sum of the integers from lo to hi, both included; 0 when lo > hi."""
    total = 0
    for n in range(lo, hi + 1):
        total += n
    return total


def count_between(lo, hi):
    """How many integers lie from lo to hi, both included."""
    return max(0, hi - lo + 1)
'''


def range_sum(rng) -> Spec:
    lo = rng.randint(1, 10)
    hi = lo + rng.randint(1, 10)
    v = rng.choice([n for n in range(-9, 10) if n])
    k = rng.randint(1, 9)
    return Spec("range_sum", ("range_sum", "sum_between", "sum_from_to", "total_between"), ("series", "runs"),
                RANGE_SUM, {}, [(hi, lo), (hi + 1, hi)], [
        Bug("off-by-one", "range(lo, hi + 1)", "range(lo, hi)", "both ends are included", [(lo, hi), (v, v)],
            [(hi, lo), (-k, 0), (hi + 1, hi)]),
        Bug("swapped", "range(lo, hi + 1)", "range(hi, lo + 1)", "it sums from lo up to hi",
            [(lo, hi), (lo, hi + rng.randint(1, 5))],
            [(v, v), (-k, k)]),
        Bug("off-by-one", "range(lo, hi + 1)", "range(lo + 1, hi + 1)", "both ends are included", [(lo, hi), (v, v)],
            [(0, hi), (hi, lo), (hi + 1, hi)]),
    ])


PERCENT = '''\
"""Percentages."""


def $fn(part, whole):
    """part as a percentage of whole, rounded to $D decimal places; 0.0 when whole is 0."""
    if whole == 0:
        return 0.0
    return round(100 * part / whole, $D)
'''


def percent(rng) -> Spec:
    d = rng.randint(1, 3)
    d2 = d + rng.choice([-1, 1])
    p, w = _ints(rng, 2, 1, 200)
    v = rng.randint(1, 200)
    return Spec("percent", ("percent", "as_percent", "percentage", "pct"), ("ratios", "progress", "shares"), PERCENT,
                {"D": d}, [(p, w), (rng.randint(0, 100), 100), (v, v)], [
        Bug("swapped", "100 * part / whole", "100 * whole / part", "it is part out of whole",
            [(p, w), tuple(_ints(rng, 2, 1, 200))], [(rng.randint(1, 50), 0), (v, v)]),
        Bug("edge-case", "    if whole == 0:\n        return 0.0\n", "", "a whole of 0 gives 0.0",
            [(rng.randint(1, 50), 0), (0, 0)]),
        Bug("constant", "whole, $D)", f"whole, {d2})", f"it rounds to {d} decimal places",
            [(rng.choice([1, 2, 4, 5]), 3), (rng.choice([1, 2, 3, 4, 5, 6]), 7)],
            [(rng.randint(0, 100), 100), (rng.randint(1, 50), 0), (v, v), (rng.randint(1, 9), 4)]),
    ])


TEMPLATES = (count_in_range, clamp, last_n, safe_div, first_index, sum_multiples, mean, chunk, range_sum, percent)
