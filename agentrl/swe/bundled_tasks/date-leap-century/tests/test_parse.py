import datetime
import unittest

from dateparse.parse import parse_date


class ParseDateTest(unittest.TestCase):
    def test_iso(self):
        self.assertEqual(parse_date("2024-03-01"), datetime.date(2024, 3, 1))

    def test_european(self):
        self.assertEqual(parse_date(" 01/03/2024 "), datetime.date(2024, 3, 1))

    def test_leap_day(self):
        self.assertEqual(parse_date("2024-02-29"), datetime.date(2024, 2, 29))

    def test_not_a_leap_year(self):
        with self.assertRaises(ValueError):
            parse_date("2023-02-29")

    def test_garbage(self):
        with self.assertRaises(ValueError):
            parse_date("2024/03/01")
