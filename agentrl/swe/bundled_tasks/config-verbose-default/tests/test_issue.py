import unittest

from confparse.config import Config


class DefaultsTest(unittest.TestCase):
    def test_verbose_is_off_by_default(self):
        self.assertFalse(Config.parse("").get_bool("verbose"))

    def test_documented_defaults(self):
        cfg = Config.parse("# nothing set\n")
        self.assertEqual((cfg.get_int("retries"), cfg.get_int("timeout")), (3, 30))

    def test_explicit_off(self):
        self.assertFalse(Config.parse("verbose = no").get_bool("verbose"))
