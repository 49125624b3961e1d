"""What every harness shares: the run it is asked for, the command it answers with, what it read back.

A harness turns one rollout attempt (`HarnessRun`) into a command (`AgentCommand`) without touching
anything (`command` is pure), reads its own output back into a `Trajectory` without ever raising,
and knows how to put its CLI into the host tools directory that sandboxes mount read-only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

PromptStyle = Literal["instruction", "dataset"]
WireProtocol = Literal["anthropic", "openai", "gemini"]
# Linux refuses a single argv string longer than this (MAX_ARG_STRLEN), whatever ARG_MAX says.
MAX_ARG_BYTES = 128 * 1024


class HarnessInstallError(RuntimeError):
    """A harness could not be installed into the tools directory; the message says what is missing."""


@dataclass(frozen=True)
class HarnessRun:
    """Everything one attempt's command depends on. Built per rollout: training and eval differ."""

    task_text: str
    prompt_style: PromptStyle
    workdir: str             # inside the sandbox
    base_url: str            # the adapter as the agent reaches it, e.g. http://127.0.0.1:8000
    api_key: str             # the session key
    model: str               # the model name the CLI sends
    max_new_tokens: int      # per-turn output budget
    max_context: int
    compact_at: float = 0.6  # fraction of max_context
    home: str = "/home/agent"
    tools_dir: str = "/opt/agentrl/tools"   # where the host tools dir is mounted read-only
    as_root: bool = False
    extra_args: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.prompt_style not in ("instruction", "dataset"):
            raise ValueError(f"prompt_style must be 'instruction' or 'dataset', got {self.prompt_style!r}")
        if not 0 < self.max_new_tokens < self.max_context:
            raise ValueError(f"need 0 < max_new_tokens < max_context, got {self.max_new_tokens} and "
                             f"{self.max_context}")
        if not 0 < self.compact_at <= 1:
            raise ValueError(f"compact_at is a fraction of max_context in (0, 1], got {self.compact_at}")
        if isinstance(self.extra_args, str):   # a lone string would be split into characters
            raise TypeError("extra_args must be a sequence of arguments, not a string")
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))


@dataclass(frozen=True)
class AgentCommand:
    """What to run in the sandbox: as the agent user, in run.workdir, with `env` on top of the sandbox's.

    `files` are absolute sandbox paths to write before running, as the user that runs the agent
    (a settings file under HOME must stay writable by the CLI that reads it).
    """

    argv: list[str]
    env: dict[str, str]
    files: dict[str, bytes]
    warnings: list[str]


@dataclass(frozen=True)
class Trajectory:
    """What the harness's own output says happened."""

    final_text: str | None
    turns: int
    tool_calls: int
    exit_reason: str | None
    raw_ok: bool            # False when the output could not be parsed


UNREADABLE = Trajectory(final_text=None, turns=0, tool_calls=0, exit_reason=None, raw_ok=False)
SUMMARY_KEYS = ("final_text", "turns", "tool_calls", "exit_reason")


def read_summary_line(stdout: bytes) -> Trajectory:
    """An agent's last stdout line, {"final_text", "turns", "tool_calls", "exit_reason"}, as the builtin agent
    and the mini-swe-agent launcher end; UNREADABLE when it is not that."""
    try:
        lines = stdout.decode("utf-8", errors="replace").strip().splitlines()
        summary = json.loads(lines[-1]) if lines else None
    except ValueError:
        return UNREADABLE
    if not isinstance(summary, dict) or not all(k in summary for k in SUMMARY_KEYS):
        return UNREADABLE
    final, turns, calls, reason = (summary[k] for k in SUMMARY_KEYS)
    if not (isinstance(final, str | None) and isinstance(reason, str | None)
            and all(isinstance(n, int) and not isinstance(n, bool) for n in (turns, calls))):
        return UNREADABLE
    return Trajectory(final_text=final, turns=turns, tool_calls=calls, exit_reason=reason, raw_ok=True)


class Harness(Protocol):
    name: str
    protocol: WireProtocol

    def install(self, tools_dir: Path) -> None: ...

    def command(self, run: HarnessRun) -> AgentCommand: ...

    def read_trajectory(self, stdout: bytes, stderr: bytes) -> Trajectory: ...


def with_overrides(argv: Sequence[str], env: Mapping[str, str], run: HarnessRun) -> tuple[list[str], dict[str, str]]:
    """The run's two knobs go after the harness's defaults, so they win. A later env key replaces an earlier
    one; on the command line each CLI takes a repeated flag's last occurrence, and where a CLI crashes on a
    repeat instead (Qwen Code's --model, --auth-type), the harness keeps that default out of argv."""
    return [*argv, *run.extra_args], {**env, **run.extra_env}


def compact_trigger(run: HarnessRun) -> int:
    """The prompt size, in tokens, at which the run asks for auto-compaction."""
    return int(run.compact_at * run.max_context)


def compaction_warnings(run: HarnessRun, fires_at: int | None, cli: str) -> list[str]:
    """Warn when compaction asked for at compact_at can never fire, or fires elsewhere than asked.

    The adapter gives a turn at most max_context - prompt tokens of output, so a prompt beyond
    max_context - max_new_tokens already has its output cut: a trigger above that line comes too late.
    `fires_at` is where the CLI will really compact (None: it has no trigger we can set).
    """
    wanted = compact_trigger(run)
    ceiling = run.max_context - run.max_new_tokens
    out = []
    if wanted > ceiling:
        out.append(f"auto-compaction at {run.compact_at:.0%} of {run.max_context} tokens ({wanted}) lies above "
                   f"max_context - max_new_tokens ({ceiling}): turns past {ceiling} tokens get less than "
                   f"max_new_tokens of output before it could fire; lower compact_at")
    if fires_at is None:
        out.append(f"{cli} has no compaction trigger the harness can set: compact_at={run.compact_at} is not applied")
    elif fires_at < wanted - 1:
        out.append(f"{cli} compacts at {fires_at} tokens, before the requested {wanted}: its own reserve "
                   f"caps the trigger at this context size")
    return out


def argv_size_warnings(prompt: str) -> list[str]:
    if len(prompt.encode()) <= MAX_ARG_BYTES - 1024:
        return []
    return [f"the prompt is {len(prompt.encode())} bytes, near or over Linux's {MAX_ARG_BYTES}-byte limit for one "
            f"argument: the CLI may fail to start; use prompt_style='instruction'"]
