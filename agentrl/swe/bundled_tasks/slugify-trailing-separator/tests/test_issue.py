import unittest

from textkit.slug import slugify


class SlugifyEdgesTest(unittest.TestCase):
    def test_punctuation_at_the_end(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_punctuation_at_the_start(self):
        self.assertEqual(slugify("--Already--slugged--"), "already-slugged")

    def test_custom_separator(self):
        self.assertEqual(slugify("  (Draft) Title? ", sep="_"), "draft_title")

    def test_nothing_left(self):
        self.assertEqual(slugify("!!!"), "")
