"""Small helpers for lists and text."""

from .chunks import chunk, paginate, window
from .search import bisect_left, contains
from .text import truncate, wrap_words

__all__ = ["bisect_left", "chunk", "contains", "paginate", "truncate", "window", "wrap_words"]
