"""A small least-recently-used cache."""

from collections import OrderedDict

_MISSING = object()


class LRUCache:
    """Holds at most `capacity` entries; a full cache drops the least recently used one.

    Both get() and put() count as a use.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._data: OrderedDict = OrderedDict()

    def get(self, key, default=None):
        value = self._data.get(key, _MISSING)
        return default if value is _MISSING else value

    def put(self, key, value) -> None:
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key) -> bool:
        return key in self._data
