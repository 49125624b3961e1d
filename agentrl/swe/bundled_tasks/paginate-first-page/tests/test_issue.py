import unittest

from pager.paginate import page_count, paginate


class PaginateTest(unittest.TestCase):
    items = list(range(10))

    def test_first_page(self):
        self.assertEqual(paginate(self.items, 1, 3), [0, 1, 2])

    def test_last_page(self):
        self.assertEqual(paginate(self.items, 4, 3), [9])

    def test_past_the_end(self):
        self.assertEqual(paginate(self.items, 5, 3), [])

    def test_every_item_once(self):
        pages = [paginate(self.items, p, 4) for p in range(1, page_count(10, 4) + 1)]
        self.assertEqual(sum(pages, []), self.items)
