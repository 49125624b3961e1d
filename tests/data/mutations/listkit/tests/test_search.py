import unittest

from listkit import bisect_left, contains


class BisectTest(unittest.TestCase):
    def test_insertion_points(self):
        items = [1, 3, 3, 5, 8]
        self.assertEqual([bisect_left(items, x) for x in (0, 1, 2, 3, 4, 8, 9)], [0, 0, 1, 1, 3, 4, 5])

    def test_empty(self):
        self.assertEqual(bisect_left([], 4), 0)

    def test_bounds(self):
        self.assertEqual(bisect_left([1, 2, 3, 4, 5], 1, lo=2), 2)
        self.assertEqual(bisect_left([1, 2, 3, 4, 5], 5, hi=3), 3)

    def test_negative_lo(self):
        with self.assertRaises(ValueError):
            bisect_left([1], 1, lo=-1)

    def test_contains(self):
        self.assertTrue(contains([2, 4, 6], 4))
        self.assertFalse(contains([2, 4, 6], 5))
        self.assertFalse(contains([2, 4, 6], 7))
