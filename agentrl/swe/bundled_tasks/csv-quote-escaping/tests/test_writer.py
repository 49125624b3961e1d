import unittest

from csvout.writer import format_row


class FormatRowTest(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(format_row(["a", 1, None]), "a,1,\r\n")

    def test_comma(self):
        self.assertEqual(format_row(["x,y", "z"]), '"x,y",z\r\n')
