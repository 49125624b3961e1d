"""Searching sorted lists."""


def bisect_left(items, x, lo=0, hi=None):
    """The first index at which `x` could be inserted into sorted `items` keeping them sorted."""
    if lo < 0:
        raise ValueError("lo must be non-negative")
    if hi is None:
        hi = len(items)
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def contains(items, x):
    """Whether sorted `items` holds `x`."""
    i = bisect_left(items, x)
    return i < len(items) and items[i] == x
