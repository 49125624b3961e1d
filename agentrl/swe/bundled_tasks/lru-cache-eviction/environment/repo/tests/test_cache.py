import unittest

from lrucache.cache import LRUCache


class CacheTest(unittest.TestCase):
    def test_get_and_put(self):
        c = LRUCache(2)
        c.put("a", 1)
        self.assertEqual(c.get("a"), 1)
        self.assertIsNone(c.get("b"))
        self.assertEqual(c.get("b", 0), 0)

    def test_capacity(self):
        c = LRUCache(2)
        for i in range(5):
            c.put(i, i)
        self.assertEqual(len(c), 2)
        self.assertNotIn(0, c)

    def test_put_refreshes(self):
        c = LRUCache(2)
        c.put("a", 1)
        c.put("b", 2)
        c.put("a", 3)
        c.put("c", 4)
        self.assertEqual((c.get("a"), "b" in c), (3, False))
