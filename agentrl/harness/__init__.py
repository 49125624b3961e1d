"""Harnesses: how each agent CLI is installed, run against the adapter, and read back (docs/harnesses.md)."""

from __future__ import annotations

from .base import AgentCommand, Harness, HarnessInstallError, HarnessRun, Trajectory
from .builtin import Builtin
from .claude_code import ClaudeCode
from .codebuddy import CodeBuddy
from .codex import Codex
from .empty_patch import EmptyPatchClass, EmptyPatchPolicy, classify_empty_patch, decide
from .gemini_cli import GeminiCli
from .mini_swe_agent import MiniSweAgent
from .opencode import OpenCode
from .openhands import OpenHands
from .prompts import PROBLEM_FILE
from .qwen_code import QwenCode

HARNESSES: dict[str, Harness] = {h.name: h for h in (ClaudeCode(), QwenCode(), Codex(), MiniSweAgent("toolcall"),
                                                     MiniSweAgent("text"), CodeBuddy(), OpenCode(),
                                                     GeminiCli(), OpenHands(), Builtin())}


def check_harness(name: str, max_context: int) -> None:
    """Refuse at launch a window below what the harness's CLI accepts (and an unknown name)."""
    harness = get_harness(name)
    least = getattr(harness, "min_context", 0)
    if max_context < least:
        why = getattr(harness, "min_context_why", "")
        raise ValueError(f"harness {name} needs adapter.max_context >= {least} ({why}); "
                         f"got {max_context}: raise adapter.max_context or choose another harness")


def get_harness(name: str) -> Harness:
    try:
        return HARNESSES[name]
    except KeyError:
        raise ValueError(f"unknown harness {name!r}; known: {', '.join(sorted(HARNESSES))}") from None


__all__ = ["HARNESSES", "PROBLEM_FILE", "AgentCommand", "EmptyPatchClass", "EmptyPatchPolicy", "Harness",
           "HarnessInstallError", "HarnessRun", "Trajectory", "check_harness", "classify_empty_patch", "decide",
           "get_harness"]
