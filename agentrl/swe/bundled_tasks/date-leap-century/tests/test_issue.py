import datetime
import unittest

from dateparse.parse import is_leap, parse_date


class CenturyLeapTest(unittest.TestCase):
    def test_2000_was_a_leap_year(self):
        self.assertEqual(parse_date("2000-02-29"), datetime.date(2000, 2, 29))
        self.assertEqual(parse_date("29/02/2400"), datetime.date(2400, 2, 29))

    def test_1900_was_not(self):
        with self.assertRaises(ValueError):
            parse_date("1900-02-29")

    def test_is_leap_matches_the_calendar(self):
        import calendar
        for year in range(1590, 2410):
            self.assertEqual(is_leap(year), calendar.isleap(year), year)
