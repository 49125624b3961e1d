import unittest

from roman.convert import to_roman


class SubtractiveTest(unittest.TestCase):
    def test_four_and_nine(self):
        self.assertEqual(to_roman(4), "IV")
        self.assertEqual(to_roman(9), "IX")

    def test_mixed(self):
        self.assertEqual(to_roman(1994), "MCMXCIV")
        self.assertEqual(to_roman(3999), "MMMCMXCIX")
        self.assertEqual(to_roman(444), "CDXLIV")

    def test_never_four_in_a_row(self):
        for n in range(1, 4000):
            s = to_roman(n)
            for c in "IXC":
                self.assertNotIn(c * 4, s, n)
