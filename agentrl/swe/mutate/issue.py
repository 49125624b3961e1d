"""A kept mutant as a Harbor task: its instruction, written as an issue, and its files (pure).

The instruction is what a user who ran the tests would report: which tests fail and what the first
one printed (its traceback cut to the test's own frames by verdict.failure_excerpts), never where
the bug is unless `hints` asks: "location" names its file and function; "fix" also gives the line
and the sed command that makes the fix, as the pyfix-hint family's instructions do (a commit's task:
its files, and the whole patch in a diff block, patch_hint), so that the
scripted teacher (agentrl/swe/teacher.py) and a policy learning from it can act on a real
project's task. The solution is the inverse of the mutant's patch, applied with `git apply` (a
plain patch outside a repository), so it changes the lines the bug changed and no others. The rest
of the layout, the grader and the task.toml are the generator's own (agentrl.swe.generate.layout),
as for every family.
"""

from __future__ import annotations

from ..families.base import Draft, GenerationError
from ..families.pyfix_hint import Hint, line_hint
from ..generate import EOF_MARK
from .operators import Site
from .project import Project, task_repository

SHOWN_TESTS = 5
SHOWN_LINES = 30


def instruction(project: str, fail_to_pass: tuple[str, ...], failures: dict[str, str],
                hint: str | None = None, runner: str = "unittest") -> str:
    shown = [f"- `{t}`" for t in fail_to_pass[:SHOWN_TESTS]]
    if len(fail_to_pass) > SHOWN_TESTS:
        shown.append(f"- and {len(fail_to_pass) - SHOWN_TESTS} more")
    first = fail_to_pass[0]
    said = failures.get(first, "").splitlines()
    if len(said) > SHOWN_LINES:
        said = said[:SHOWN_LINES // 2] + ["[...]"] + said[-SHOWN_LINES // 2:]
    parts = [f"{'A test' if len(fail_to_pass) == 1 else f'{len(fail_to_pass)} tests'} of {project} "
             f"{'fails' if len(fail_to_pass) == 1 else 'fail'}:", "", *shown, "",
             f"`python3 -m {runner} {first}` says:", "", "```", *(said or ["(no traceback)"]), "```", ""]
    if hint:
        parts += [hint, ""]
    parts.append("The tests say what the code should do: fix the code, not the tests, so that they pass.")
    return "\n".join(parts) + "\n"


PATCH_FENCE = "```diff"


def patch_hint(files: tuple[str, ...], patch: bytes | None) -> str:
    """A commit's hint: the files its fix changes, and with `patch` the fix itself between PATCH_FENCE and a
    closing fence (no line of a patch is either: each starts with its kind), for the scripted teacher."""
    hint = f"The change is in {', '.join(f'`{f}`' for f in files)}."
    if patch is not None:
        hint += f"\nThe fix, as `git apply` takes it:\n\n{PATCH_FENCE}\n{patch.decode()}```"
    return hint


def solve_sh(inverse: bytes, what: str = "the inverse of the injected bug's patch") -> bytes:
    text = inverse.decode()
    if EOF_MARK in text.splitlines():
        raise ValueError(f"the patch holds a line {EOF_MARK}: a heredoc cannot carry it")
    return (f"#!/usr/bin/env bash\n# Reference solution: {what}.\n"
            "set -euo pipefail\ncd \"${TESTBED:-/testbed}\"\n"
            f"git apply --whitespace=nowarn <<'{EOF_MARK}'\n{text}{EOF_MARK}\n").encode()


def fixable(path: str, original: bytes, site: Site) -> bool:
    """Whether the site's bug has a one-line sed fix (`fix_hint`), from its line alone: no mutant is made."""
    lines = original.decode(errors="replace").splitlines()
    if not 0 < site.line <= len(lines) or lines[site.line - 1].count(site.before) != 1:
        return False
    line = lines[site.line - 1]
    return line_hint(path, line.replace(site.before, site.after), line, site.after, site.before) is not None


def fix_hint(path: str, mutated: str, original: str, site: Site) -> Hint:
    """The sed command that undoes the site's bug in the mutated file, for a site `fixable` passed."""
    hint = line_hint(path, mutated, original, site.after, site.before)
    if hint is None:
        raise GenerationError(f"{path}:{site.line}: the {site.operator} bug ({site.before!r} -> {site.after!r}) "
                              "passed the one-line check but its mutant differs elsewhere: report this")
    return hint


def draft(project: Project, key: str, path: str, mutated: str, site: Site,
          fail_to_pass: tuple[str, ...], pass_to_pass: tuple[str, ...], failures: dict[str, str],
          hints: str | None, runner: str = "unittest") -> Draft:
    hint = f"The bug is in `{path}`, in `{site.function}`." if hints else None
    if hints == "fix":
        hint = f"{hint}\n{fix_hint(path, mutated, project.files[path].decode(), site).text().rstrip()}"
    return Draft(
        key=key,
        instruction=instruction(project.name, fail_to_pass, failures, hint, runner),
        repo={**task_repository(project), path: mutated.encode()},
        fixed={path: project.files[path]},
        hidden={},
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        description=f"{site.operator} bug in {site.function} ({path}) of {project.name}",
        metadata={"project": project.name, "operator": site.operator, "path": path, "function": site.function,
                  "line": str(site.line)},
    )
