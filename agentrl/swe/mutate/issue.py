"""A kept mutant as a Harbor task: its instruction, written as an issue, and its files (pure).

The instruction is what a user who ran the tests would report: which tests fail and what the first
one printed (its traceback cut to the test's own frames by verdict.failure_excerpts), never where
the bug is unless `hints` asks. The solution is the inverse of the mutant's patch, applied with
`git apply` (a plain patch outside a repository), so it changes the lines the bug changed and no
others. The rest of the layout, the grader and the task.toml are the generator's own
(agentrl.swe.generate.layout), as for every family.
"""

from __future__ import annotations

from ..families.base import Draft
from ..generate import EOF_MARK
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


def solve_sh(inverse: bytes) -> bytes:
    text = inverse.decode()
    if EOF_MARK in text.splitlines():
        raise ValueError(f"the patch holds a line {EOF_MARK}: a heredoc cannot carry it")
    return ("#!/usr/bin/env bash\n# Reference solution: the inverse of the injected bug's patch.\n"
            "set -euo pipefail\ncd \"${TESTBED:-/testbed}\"\n"
            f"git apply --whitespace=nowarn <<'{EOF_MARK}'\n{text}{EOF_MARK}\n").encode()


def draft(project: Project, key: str, path: str, mutated: str, operator: str, function: str, line: int,
          fail_to_pass: tuple[str, ...], pass_to_pass: tuple[str, ...], failures: dict[str, str],
          hints: bool, runner: str = "unittest") -> Draft:
    hint = f"The bug is in `{path}`, in `{function}`." if hints else None
    return Draft(
        key=key,
        instruction=instruction(project.name, fail_to_pass, failures, hint, runner),
        repo={**task_repository(project), path: mutated.encode()},
        fixed={path: project.files[path]},
        hidden={},
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        description=f"{operator} bug in {function} ({path}) of {project.name}",
        metadata={"project": project.name, "operator": operator, "path": path, "function": function,
                  "line": str(line)},
    )
