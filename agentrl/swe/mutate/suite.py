"""Where a project's tests live, found the way its own runner finds them (pure, over the project's files).

pytest's configuration comes first when the project has one with `testpaths` (pytest.ini, pyproject.toml's
[tool.pytest.ini_options], tox.ini's [pytest], setup.cfg's [tool:pytest]: the first of these that has a
pytest section is the one pytest reads, as pytest chooses its inifile): only test modules below those
paths count; its `python_files`, when set, are the test modules' patterns in place of the defaults.
Either way a test module (`test_*.py`, `*_test.py`, `test.py`, `tests.py`, and in a directory named tests
or test whatever unittest's `test*.py` takes) belongs to the topmost directory on
its path named `tests` or `test`, or else to the testpath it lies under; that directory, whole, is a test
directory: its helpers, data and conftest.py files are the suite's, never mutated, and the verifier puts
its copy back before grading. Test modules beside the source (`pkg/test_x.py`, outside any such
directory) are not part of the suite: their directory holds code a bug can be put in.
"""

from __future__ import annotations

import configparser
import fnmatch
import re
import sys
from dataclasses import dataclass

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

TEST_DIR_NAMES = frozenset({"tests", "test"})
# pytest's test_*.py and *_test.py, and test.py, tests.py (which unittest's test*.py takes too; testing.py,
# which it also takes, is more often a helper module of the code)
TEST_MODULE = re.compile(r"(?:test_[^/]*|[^/]*_test|tests?)\.py")
# unittest discover's default pattern: what it runs in a test directory (testlex.py)
DISCOVERED = re.compile(r"test[^/]*\.py")
# pytest's inifile, in the order it looks for one at the root, each with the section that makes it one
PYTEST_CONFIGS = (("pytest.ini", "pytest"), ("pyproject.toml", "tool.pytest.ini_options"),
                  ("tox.ini", "pytest"), ("setup.cfg", "tool:pytest"))
DEFAULT = ("tests",)


def looks_like_test(path: str) -> bool:
    """A test module, or a file in a directory named tests or test (of the suite or not: never a bug's
    place, and in a traceback one of the test's own frames)."""
    *parents, name = path.split("/")
    return bool(TEST_DIR_NAMES.intersection(parents)) or TEST_MODULE.fullmatch(name) is not None


@dataclass(frozen=True)
class TestLayout:
    """A project's test directories (repository paths, sorted, none inside another) and how they were found."""
    dirs: tuple[str, ...]
    found_by: str

    @property
    def default(self) -> bool:
        """tests/ alone: the layout every task had before, graded without expected.json's test_dirs."""
        return self.dirs == DEFAULT

    def holds(self, rel: str) -> bool:
        """`rel` is part of the suite: under a test directory, or a conftest.py above one."""
        if any(rel.startswith(d + "/") for d in self.dirs):
            return True
        parent = rel.rpartition("/")[0]
        return rel.rpartition("/")[2] == "conftest.py" and any(
            parent == "" or d.startswith(parent + "/") for d in self.dirs)


def pytest_options(files: dict[str, bytes]) -> tuple[dict[str, list[str]], str] | None:
    """The options of pytest's configuration this module reads (testpaths, python_files: each a list, empty
    when unset) and the file they come from, or None when the project has no pytest configuration. A
    configuration pytest could not read is read as none: its own run would fail."""
    def listed(value: object) -> list[str]:
        if isinstance(value, str):
            return value.split()
        return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

    for name, section in PYTEST_CONFIGS:
        if name not in files:
            continue
        text = files[name].decode("utf-8", errors="replace")
        if name.endswith(".toml"):
            try:
                options = tomllib.loads(text).get("tool", {}).get("pytest", {}).get("ini_options")
            except tomllib.TOMLDecodeError:
                continue
            if options is None:
                continue
            return {key: listed(options.get(key)) for key in ("testpaths", "python_files")}, name
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(text, source=name)
        except configparser.Error:
            continue
        if not parser.has_section(section):
            if name == "pytest.ini":    # pytest.ini is pytest's file even without the section
                return {}, name
            continue
        return {key: parser.get(section, key, fallback="").split() for key in ("testpaths", "python_files")}, name
    return None


def _under(rel: str, path: str) -> bool:
    return path in ("", ".") or rel.startswith(path + "/")


def find(files: dict[str, bytes]) -> TestLayout:
    """The project's test directories; `dirs` is empty when it has none (check_layout refuses it, naming
    what `found_by` says was searched)."""
    options, source = pytest_options(files) or ({}, "")
    globs = options.get("python_files")

    def test_module(rel: str) -> bool:
        name = rel.rpartition("/")[2]
        if globs:       # the project's own patterns, in place of pytest's defaults
            return any(fnmatch.fnmatchcase(name, g) for g in globs)
        return TEST_MODULE.fullmatch(name) is not None or (
            DISCOVERED.fullmatch(name) is not None and bool(TEST_DIR_NAMES.intersection(rel.split("/")[:-1])))
    modules = [rel for rel in files if test_module(rel)]
    kind = (f"modules matching python_files in {source} ({' '.join(globs)})" if globs
            else "test_*.py or *_test.py modules")
    paths = [p for p in (p.strip("/").removeprefix("./") for p in options.get("testpaths", [])) if p]
    roots: list[str] = []
    if paths:
        known = {rel.rpartition("/")[0] for rel in files} | {""}
        dirs_of = {p: sorted(d for d in known if fnmatch.fnmatchcase(d, p)) or [p] for p in paths}
        chosen = [d for p in paths for d in dirs_of[p]]
        modules = [m for m in modules if any(_under(m, d) for d in chosen)]
        found_by = f"pytest's testpaths in {source} ({' '.join(paths)})" + (f", {kind}" if globs else "")
    else:
        chosen, found_by = [], f"directories named tests or test holding {kind}"
    for m in modules:
        parts = m.split("/")[:-1]
        named = next((i for i, p in enumerate(parts) if p in TEST_DIR_NAMES), None)
        if named is not None:
            roots.append("/".join(parts[:named + 1]))
        else:   # below a testpath that is not itself named tests: that testpath (not the root)
            roots += [d for d in chosen if d not in ("", ".") and _under(m, d)][:1]
    unique = sorted(set(roots))
    return TestLayout(tuple(d for d in unique if not any(d.startswith(o + "/") for o in unique)), found_by)
