import unittest

from confparse.config import Config


class ParseTest(unittest.TestCase):
    def test_values_and_comments(self):
        cfg = Config.parse("retries = 5  # more\n\ntimeout=10\n")
        self.assertEqual(cfg.get_int("retries"), 5)
        self.assertEqual(cfg.get_int("timeout"), 10)

    def test_explicit_bool(self):
        self.assertTrue(Config.parse("verbose = on").get_bool("verbose"))

    def test_bad_line(self):
        with self.assertRaises(ValueError):
            Config.parse("retries 5")
