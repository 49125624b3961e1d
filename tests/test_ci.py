"""The rule that keeps CI from passing on skipped tests: a missing part CI installs fails under CI."""

import pytest
from ci import require_module, skip_or_fail, under_ci


@pytest.mark.parametrize("value,ci", [("true", True), ("1", True), ("yes", True), ("True", True), ("on", True),
                                      ("", False), ("0", False), ("false", False), ("FALSE", False), ("no", False),
                                      ("off", False), (None, False)])
def test_any_truthy_ci_value_is_ci(value, ci):
    assert under_ci({} if value is None else {"CI": value}) is ci


def test_a_missing_part_fails_under_ci_and_skips_elsewhere_naming_how_to_install_it(monkeypatch):
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="CI must run the W tests: .*no_such_mod.*pip install x"):
        require_module("no_such_mod", "the W tests", "pip install x")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="no_such_mod cannot be imported .*pip install x"):
        require_module("no_such_mod", "the W tests", "pip install x")
    with pytest.raises(pytest.skip.Exception, match="^why$"):
        skip_or_fail("the W tests", "why")
    assert require_module("json", "the W tests", "-").dumps([]) == "[]"
