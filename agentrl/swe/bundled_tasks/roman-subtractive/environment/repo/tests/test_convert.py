import unittest

from roman.convert import to_roman


class ToRomanTest(unittest.TestCase):
    def test_additive(self):
        self.assertEqual(to_roman(3), "III")
        self.assertEqual(to_roman(58), "LVIII")
        self.assertEqual(to_roman(2023), "MMXXIII")

    def test_range(self):
        for n in (0, 4000, -1):
            with self.assertRaises(ValueError):
                to_roman(n)
