"""Merging closed intervals [start, end]."""


def merge_intervals(intervals):
    """The union of closed intervals as sorted, disjoint intervals.

    Intervals that overlap or touch ([1, 2] and [2, 3]) are merged.
    """
    merged = []
    for start, end in sorted(intervals):
        if start > end:
            raise ValueError(f"bad interval [{start}, {end}]")
        if merged and start <= merged[-1][1]:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    return merged
