import unittest

from listkit import chunk, paginate, window


class ChunkTest(unittest.TestCase):
    def test_even(self):
        self.assertEqual(chunk([1, 2, 3, 4], 2), [[1, 2], [3, 4]])

    def test_short_last(self):
        self.assertEqual(chunk([1, 2, 3, 4, 5], 2), [[1, 2], [3, 4], [5]])

    def test_size_checked(self):
        with self.assertRaises(ValueError):
            chunk([1], 0)
        with self.assertRaises(TypeError):
            chunk([1], "2")


class WindowTest(unittest.TestCase):
    def test_pairs(self):
        self.assertEqual(window([1, 2, 3, 4], 2), [(1, 2), (2, 3), (3, 4)])

    def test_step(self):
        self.assertEqual(window([1, 2, 3, 4, 5], 2, step=2), [(1, 2), (3, 4)])

    def test_too_short(self):
        self.assertEqual(window([1, 2], 3), [])


class PaginateTest(unittest.TestCase):
    def test_first_page(self):
        self.assertEqual(paginate(list(range(25)), 1), list(range(10)))

    def test_last_page(self):
        self.assertEqual(paginate(list(range(25)), 3), [20, 21, 22, 23, 24])

    def test_past_the_end(self):
        self.assertEqual(paginate(list(range(25)), 4), [])

    def test_per_page(self):
        self.assertEqual(paginate(list("abcdefg"), 2, per_page=3), ["d", "e", "f"])
