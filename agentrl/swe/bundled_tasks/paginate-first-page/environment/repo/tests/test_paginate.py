import unittest

from pager.paginate import page_count, paginate


class PageCountTest(unittest.TestCase):
    def test_partial_last_page(self):
        self.assertEqual(page_count(10, 3), 4)

    def test_exact(self):
        self.assertEqual(page_count(9, 3), 3)

    def test_empty(self):
        self.assertEqual(page_count(0, 3), 1)

    def test_page_zero_is_refused(self):
        with self.assertRaises(ValueError):
            paginate([1, 2, 3], 0, 2)
