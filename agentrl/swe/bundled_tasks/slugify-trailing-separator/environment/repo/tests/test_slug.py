import unittest

from textkit.slug import slugify


class SlugifyTest(unittest.TestCase):
    def test_words(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_digits(self):
        self.assertEqual(slugify("Release 2 notes"), "release-2-notes")
