import csv
import io
import unittest

from csvout.writer import format_row


class QuotingTest(unittest.TestCase):
    def roundtrip(self, row):
        (back,) = list(csv.reader(io.StringIO(format_row(row), newline="")))
        return back

    def test_embedded_quotes_are_doubled(self):
        self.assertEqual(format_row(['say "hi"']), '"say ""hi"""\r\n')

    def test_newlines_are_quoted(self):
        self.assertEqual(self.roundtrip(["line1\nline2", "b"]), ["line1\nline2", "b"])
        self.assertEqual(self.roundtrip(["cr\r\nlf"]), ["cr\r\nlf"])

    def test_everything_at_once(self):
        row = ['a "quoted", field', "plain", "", 'tail"']
        self.assertEqual(self.roundtrip(row), row)
