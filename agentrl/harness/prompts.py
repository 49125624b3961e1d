"""Prompt styles: how the task text reaches the agent.

- `instruction`: the task text is written to PROBLEM_STATEMENT.md at the root of the work tree and the
  prompt tells the agent to read it. The prompt stays short and the same for every task; the file is
  excluded from the patch (the pool adds PROBLEM_FILE to the task's excludes).
- `dataset`: the prompt is the task text itself, exactly as the data set gives it.

Training and eval each choose their own style; it travels in every HarnessRun, never in a global.
"""

from __future__ import annotations

from .base import HarnessRun

PROBLEM_FILE = "PROBLEM_STATEMENT.md"

INSTRUCTION_PROMPT = (
    "The task for you is described in {problem_file} in the repository at {workdir}. "
    "Read that file first, then make the changes it asks for in the repository. "
    "Do not edit or delete {problem_file}."
)


def problem_path(workdir: str) -> str:
    return f"{workdir.rstrip('/')}/{PROBLEM_FILE}"


def prompt_and_files(run: HarnessRun) -> tuple[str, dict[str, bytes]]:
    """The prompt to pass to the agent, and the files (sandbox path -> bytes) it needs to find."""
    if run.prompt_style == "dataset":
        return run.task_text, {}
    if run.prompt_style == "instruction":
        prompt = INSTRUCTION_PROMPT.format(problem_file=PROBLEM_FILE, workdir=run.workdir)
        return prompt, {problem_path(run.workdir): run.task_text.encode()}
    raise ValueError(f"unknown prompt style {run.prompt_style!r}")
