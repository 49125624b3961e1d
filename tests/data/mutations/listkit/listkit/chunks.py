"""Cutting lists into pieces."""

from ._check import positive


def chunk(items, size):
    """`items` cut into lists of `size` items, in order; the last one may be shorter."""
    positive(size, "size")
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def window(items, n, step=1):
    """Every run of `n` consecutive items, starting `step` apart, as tuples."""
    positive(n, "n")
    positive(step, "step")
    out = []
    for start in range(0, len(items) - n + 1, step):
        out.append(tuple(items[start:start + n]))
    return out


def paginate(items, page, per_page=10):
    """Page `page` (numbered from 1) of `items`, `per_page` to a page; [] past the last page."""
    positive(page, "page")
    positive(per_page, "per_page")
    start = (page - 1) * per_page
    if start >= len(items):
        return []
    return list(items[start:start + per_page])


def page_count(items, per_page=10):
    """How many pages `items` fill."""
    positive(per_page, "per_page")
    return (len(items) + per_page - 1) // per_page
