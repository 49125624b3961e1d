import unittest

from intervals.merge import merge_intervals


class NestedTest(unittest.TestCase):
    def test_contained_interval(self):
        self.assertEqual(merge_intervals([[1, 10], [2, 3]]), [[1, 10]])

    def test_contained_then_more(self):
        self.assertEqual(merge_intervals([[1, 10], [2, 3], [4, 12], [20, 21]]), [[1, 12], [20, 21]])

    def test_union_covers_every_point(self):
        data = [[0, 5], [1, 2], [3, 4], [7, 9], [8, 8]]
        merged = merge_intervals(data)
        for s, e in data:
            self.assertTrue(any(a <= s and e <= b for a, b in merged), (s, e))
