"""The pyfix family: a tiny Python package with one injected bug in one function.

A task is one template (pyfix_templates.py) with one of its bugs, a package, module and
function name, and the constants and calls the template drew. The repository is the package
(one module) and a tests/ file of calls the bug leaves alone; the hidden tests are the calls
it changes (FAIL_TO_PASS) and one it does not. Every expected value, and the instruction's
"returns X; it should return Y", comes from running the buggy and the fixed code here, on
this interpreter: nothing is written by hand that the code could contradict.

The instruction says only what a fix needs: the call, the file, what it does now, what it
should do and why, always in the same sentence, so a small policy can learn to read it.
"""

from __future__ import annotations

import builtins
import copy
import json
import random
import string

from .base import Draft, GenerationError
from .pyfix_templates import TEMPLATES, Bug, Spec

# Top-level package names (none is a stdlib module: the tests import them as `pkg.module`).
PACKAGES = ("util", "core", "helpers", "toolkit", "common", "mathutil", "basics", "numlib")
HIDDEN = "test_issue.py"
INSTRUCTION = ("`{call}` in `{path}` {now}; it should {want} ({note}). Fix the bug; the tests in tests/ show "
               "the intended behaviour, and `python3 -m unittest` runs them.\n")


def _load(source: str, fn: str, where: str):
    namespace: dict = {"__name__": "pyfix_draft"}
    exec(compile(source, where, "exec"), namespace)   # the generator's own templates, nothing from outside
    return namespace[fn]


def outcome(func, args: tuple) -> tuple[str, object]:
    """("returns", value) or ("raises", the exception's name): what a test of this call sees."""
    try:
        return "returns", func(*copy.deepcopy(args))
    except Exception as e:  # any exception is an outcome a test can assert
        return "raises", type(e).__name__


def says(o: tuple[str, object], present: bool) -> str:
    kind, value = o
    if kind == "raises":
        return f"{'raises' if present else 'raise'} {value}"
    return f"{'returns' if present else 'return'} {value!r}"


def _call(fn: str, args: tuple) -> str:
    return f"{fn}({', '.join(map(repr, args))})"


def _test(name: str, fn: str, args: tuple, want: tuple[str, object]) -> str:
    if want[0] == "raises":
        body = f"        with self.assertRaises({want[1]}):\n            {_call(fn, args)}\n"
    else:
        body = f"        self.assertEqual({_call(fn, args)}, {want[1]!r})\n"
    return f"    def {name}(self):\n{body}"


def _test_file(pkg: str, mod: str, fn: str, cls: str, tests: list[str]) -> bytes:
    head = f"import unittest\n\nfrom {pkg}.{mod} import {fn}\n\n\nclass {cls}(unittest.TestCase):\n"
    return (head + "\n".join(tests)).encode()


def _literal(value: object) -> bool:
    """A value a test can spell: its repr reads back as an equal value."""
    try:
        return eval(repr(value), {"__builtins__": {}}) == value
    except Exception:
        return False


def build(spec: Spec, bug: Bug, fn: str, pkg: str, mod: str) -> Draft:
    """The draft of one (template, bug, names); GenerationError when the template's claims are wrong."""
    values = {"fn": fn, **spec.consts}
    fixed = string.Template(spec.source).substitute(values)
    old, new = (string.Template(s).substitute(values) for s in (bug.old, bug.new))
    what = f"pyfix template {spec.template!r}, {bug.kind} bug {old!r} -> {new!r}"
    if fixed.count(old) != 1:
        raise GenerationError(f"{what}: the fixed source holds {old!r} {fixed.count(old)} times, not once")
    buggy = fixed.replace(old, new)
    path = f"{pkg}/{mod}.py"
    good, bad = _load(fixed, fn, path), _load(buggy, fn, path)
    normals = bug.normals if bug.normals is not None else spec.normals
    if not bug.triggers or len(normals) < 2:
        raise GenerationError(f"{what}: needs a call that shows the bug and two it leaves alone")
    calls = [(args, True) for args in bug.triggers] + [(args, False) for args in normals]
    want_of = {}
    for args, shows in calls:
        want = want_of[repr(args)] = outcome(good, args)
        if not (_literal(want[1]) if want[0] == "returns" else isinstance(getattr(builtins, str(want[1]), None), type)):
            raise GenerationError(f"{what}: {_call(fn, args)} {says(want, True)}, which no test can spell")
        if (outcome(bad, args) != want) != shows:
            raise GenerationError(f"{what}: the bug {'does not change' if shows else 'changes'} "
                                  f"{_call(fn, args)} ({says(want, True)}), a call it should "
                                  f"{'change' if shows else 'leave alone'}")

    cls = "".join(w.title() for w in fn.split("_")) + "Test"
    visible = [_test(f"test_example_{i}", fn, a, want_of[repr(a)]) for i, a in enumerate(normals[:-1], 1)]
    hidden = [_test("test_reported", fn, bug.triggers[0], want_of[repr(bug.triggers[0])])]
    hidden += [_test("test_similar", fn, a, want_of[repr(a)]) for a in bug.triggers[1:2]]
    hidden.append(_test("test_unchanged", fn, normals[-1], want_of[repr(normals[-1])]))
    f2p = ["tests.test_issue.IssueTest.test_reported"] + (["tests.test_issue.IssueTest.test_similar"]
                                                          if len(bug.triggers) > 1 else [])
    p2p = ["tests.test_issue.IssueTest.test_unchanged",
           *(f"tests.test_{mod}.{cls}.test_example_{i}" for i in range(1, len(visible) + 1))]
    first = bug.triggers[0]
    key = json.dumps({"template": spec.template, "bug": [bug.kind, bug.old, bug.new], "consts": spec.consts,
                      "triggers": bug.triggers, "normals": normals}, sort_keys=True)
    return Draft(
        key=key,
        instruction=INSTRUCTION.format(call=_call(fn, first), path=path, now=says(outcome(bad, first), True),
                                       want=says(want_of[repr(first)], False), note=bug.note),
        repo={f"{pkg}/__init__.py": b"", path: buggy.encode(), "tests/__init__.py": b"",
              f"tests/test_{mod}.py": _test_file(pkg, mod, fn, cls, visible)},
        fixed={path: fixed.encode()},
        hidden={HIDDEN: _test_file(pkg, mod, fn, "IssueTest", hidden)},
        fail_to_pass=tuple(f2p),
        pass_to_pass=tuple(p2p),
        description=f"{bug.kind} bug in {fn} ({path})",
        metadata={"template": spec.template, "bug_kind": bug.kind, "function": f"{pkg}.{mod}.{fn}"},
        edit=(old, new),
    )


def draw(rng: random.Random) -> Draft:
    """One pyfix task: a template, then one of its bugs, then names, all from `rng`."""
    spec = rng.choice(TEMPLATES)(rng)
    bug = rng.choice(spec.bugs)
    return build(spec, bug, rng.choice(spec.names), rng.choice(PACKAGES), rng.choice(spec.modules))
