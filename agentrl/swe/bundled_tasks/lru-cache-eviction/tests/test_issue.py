import unittest

from lrucache.cache import LRUCache


class EvictionOrderTest(unittest.TestCase):
    def test_get_counts_as_a_use(self):
        c = LRUCache(2)
        c.put("a", 1)
        c.put("b", 2)
        self.assertEqual(c.get("a"), 1)
        c.put("c", 3)
        self.assertIn("a", c)
        self.assertNotIn("b", c)

    def test_miss_changes_nothing(self):
        c = LRUCache(2)
        c.put("a", 1)
        c.put("b", 2)
        c.get("zzz")
        c.put("c", 3)
        self.assertEqual(("a" in c, "b" in c, "c" in c), (False, True, True))

    def test_falsy_values_are_hits(self):
        c = LRUCache(1)
        c.put("a", None)
        self.assertIsNone(c.get("a", "default"))
