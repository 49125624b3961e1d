import unittest

from listkit import truncate, wrap_words


class TruncateTest(unittest.TestCase):
    def test_fits(self):
        self.assertEqual(truncate("hello", 5), "hello")

    def test_cut(self):
        self.assertEqual(truncate("hello world", 8), "hello...")

    def test_narrower_than_suffix(self):
        self.assertEqual(truncate("hello", 2), "..")

    def test_custom_suffix(self):
        self.assertEqual(truncate("hello world", 6, suffix="~"), "hello~")


class WrapTest(unittest.TestCase):
    def test_lines(self):
        self.assertEqual(wrap_words("the quick brown fox jumps", 10), ["the quick", "brown fox", "jumps"])

    def test_long_word(self):
        self.assertEqual(wrap_words("a extraordinarily b", 5), ["a", "extraordinarily", "b"])

    def test_empty(self):
        self.assertEqual(wrap_words("   ", 4), [])
