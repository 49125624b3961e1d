"""Reading the `--output-format stream-json` output that Claude Code, Qwen Code and CodeBuddy Code share.

One JSON object per line: `system` (init), `assistant` and `user` messages (Anthropic-shaped content
blocks), `stream_event`s (Qwen), and a closing `result` with `subtype`, `num_turns` and `result` (the
final answer's text). Messages of sub-agents carry a `parent_tool_use_id` and are not the agent's own
turns. Anything unparseable degrades to `raw_ok=False`; this never raises.
"""

from __future__ import annotations

import json
from typing import Any

from .base import UNREADABLE, Trajectory


def json_lines(stdout: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a CLI's stdout, one a line; other lines (logs, partial writes) are skipped."""
    out = []
    for line in stdout.decode("utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _blocks(message: Any) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def read_stream_json(stdout: bytes) -> Trajectory:
    try:
        objects = json_lines(stdout)
    except Exception:  # noqa: BLE001 - a reader of foreign output must not raise
        return UNREADABLE
    turns = tool_calls = 0
    last_text: str | None = None
    result: dict[str, Any] | None = None
    for obj in objects:
        kind = obj.get("type")
        if kind == "result":
            result = obj
        elif kind == "assistant" and obj.get("parent_tool_use_id") is None:
            blocks = _blocks(obj.get("message"))
            # Both CLIs may split one turn over several `assistant` lines, so this count is only an
            # upper bound, used when there is no `result` line to give num_turns.
            turns += 1
            tool_calls += sum(1 for b in blocks if b.get("type") == "tool_use")
            texts = [text for b in blocks if b.get("type") == "text" and isinstance(text := b.get("text"), str)]
            if texts:
                last_text = "".join(texts)
    if result is None:
        return Trajectory(final_text=last_text, turns=turns, tool_calls=tool_calls, exit_reason=None, raw_ok=False)
    final, num_turns, subtype = result.get("result"), result.get("num_turns", turns), result.get("subtype")
    # An error result may carry no text; a result of the wrong shape is not one we understand.
    well_formed = (isinstance(final, str | None) and isinstance(subtype, str)
                   and isinstance(num_turns, int) and not isinstance(num_turns, bool))
    if not well_formed:
        return Trajectory(final_text=last_text, turns=turns, tool_calls=tool_calls, exit_reason=None, raw_ok=False)
    return Trajectory(final_text=final, turns=num_turns, tool_calls=tool_calls, exit_reason=subtype, raw_ok=True)
