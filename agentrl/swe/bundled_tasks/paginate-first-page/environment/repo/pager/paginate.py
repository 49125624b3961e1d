"""Pages of a list. Pages are numbered from 1."""

import math


def page_count(total: int, per_page: int) -> int:
    if per_page <= 0:
        raise ValueError("per_page must be positive")
    return max(1, math.ceil(total / per_page))


def paginate(items: list, page: int, per_page: int) -> list:
    """The items on `page` (1-based); an empty list past the last page."""
    if page < 1:
        raise ValueError("pages are numbered from 1")
    start = page * per_page
    return items[start:start + per_page]
