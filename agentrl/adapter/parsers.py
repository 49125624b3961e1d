"""A model's raw output text -> reasoning, content and tool calls, in the formats of SGLang's parsers.

The text is the decoded completion with its final stop token (`<|im_end|>`) removed. Parsing never
raises and never drops text: output that does not fit its format is kept as content and flagged.
The rules, where SGLang is lenient or silent:

Reasoning, parser "qwen3"; canonical text `<think>\\n{reasoning}\\n</think>\\n\\n{content}`:
- The first `</think>` ends the reasoning. A `<think>` at the very start of the text opens it;
  without one, everything before `</think>` is reasoning (templates that open `<think>` in the
  prompt). One leading and one trailing "\\n" of the reasoning are removed, and up to two leading
  "\\n" of the content. So reasoning cannot contain `</think>`, and an output without reasoning
  cannot contain `</think>` anywhere (a tool argument included) or start with `<think>`.
- A `<think>` that never closes (truncated output): all of it is reasoning (newlines removed as
  above), content is empty and `truncated_reasoning` is set; that is not ill-formed.
- Without think tags, or with parser None, reasoning is None and all the text is content.
- Tool calls are looked for in the content only, never in the reasoning.

Tool calls, parsers "qwen3_coder" (XML), "qwen25" and its alias "hermes" (JSON):
- Content is the text before the first `<tool_call>`, less one trailing "\\n" (the separator a
  canonical text puts before the calls), so content cannot contain `<tool_call>`.
- From the first `<tool_call>` on, the text must be tool calls and whitespace only; the whitespace
  between and after the calls is dropped. Anything else (text between or after the calls, an
  unclosed `<tool_call>`, malformed XML or JSON, a missing function or parameter name, a repeated
  parameter, a function not in `tools` when `tools` is given) makes the whole output ill-formed:
  no tool calls, content is all the text after the reasoning, unchanged, and `problems` says what
  went wrong and at which offset of that text.
- qwen3_coder values lose one leading and one trailing "\\n", then follow the parameter's JSON
  schema type: "string" keeps the text exactly; the other JSON types are parsed as JSON, and text
  that does not parse is kept as a string with a note in `problems` (as SGLang does; not
  ill-formed). Without a single schema type (no `tools`, a parameter not in the schema, a type
  list, anyOf) a value that parses as JSON other than a string literal (`3`, `true`, `null`,
  `[...]`, `{...}`) becomes that value, anything else stays text. A value runs to the first
  `</parameter>`, so a string value cannot contain `</parameter>`; `<tool_call>`, `</tool_call>`
  and any other text are fine.
- qwen25 reads `{"name": ..., "arguments": {...}}` as one JSON value: its strings may hold anything.
- NaN and Infinity are not JSON and are not accepted as numbers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

THINK_START, THINK_END = "<think>", "</think>"
CALL_START, CALL_END = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]  # in the order they appeared


@dataclass(frozen=True)
class ParsedOutput:
    reasoning: str | None = None
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    ill_formed: bool = False
    truncated_reasoning: bool = False
    problems: tuple[str, ...] = ()


class _IllFormed(Exception):
    """Raised while reading tool calls only; parse_output turns it into an ill-formed result."""


def _fail(what: str, text: str, pos: int) -> _IllFormed:
    return _IllFormed(f"{what} at offset {pos}: {text[pos:pos + 40]!r}")


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


_JSON = json.JSONDecoder(parse_constant=_not_json)
_JSON_ERRORS = (ValueError, RecursionError)
_WS = re.compile(r"\s*")


def _skip_ws(text: str, pos: int) -> int:
    """Where the whitespace at `pos` ends (_WS matches anywhere, if only the empty string)."""
    m = _WS.match(text, pos)
    assert m is not None
    return m.end()


def _strip_newline(s: str) -> str:
    """Less the one leading and one trailing "\\n" that a canonical text puts around a block."""
    s = s.removeprefix("\n")
    return s.removesuffix("\n")


def _split_reasoning(text: str) -> tuple[str | None, str, bool]:
    """(reasoning, the text after it, truncated)."""
    opened = text.startswith(THINK_START)
    end = text.find(THINK_END)
    if end < 0:
        return (_strip_newline(text[len(THINK_START):]), "", True) if opened else (None, text, False)
    reasoning = text[len(THINK_START) if opened else 0:end]
    rest = text[end + len(THINK_END):]
    return _strip_newline(reasoning), rest[2:] if rest.startswith("\n\n") else rest.removeprefix("\n"), False


_JSON_TYPES = ("integer", "number", "boolean", "object", "array", "null")


def _convert(raw: str, schema_type: Any) -> tuple[Any, str | None]:
    """A qwen3_coder parameter's value, and a note when it is not what its schema says."""
    if schema_type == "string":
        return raw, None
    try:
        value = _JSON.decode(raw)
    except _JSON_ERRORS as e:
        return raw, f"not {schema_type} ({e}), kept as text" if schema_type in _JSON_TYPES else None
    return (value, None) if schema_type in _JSON_TYPES or not isinstance(value, str) else (raw, None)


_FUNCTION = re.compile(r"\s*<function=([^>\n]*)>")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]*)>")
_PARAMETER_END = "</parameter>"
_XML_CALL_END = re.compile(r"\s*</function>\s*</tool_call>")


def _parse_xml_call(text: str, pos: int, schemas: Mapping[str, Mapping]) -> tuple[ToolCall, int, list[str]]:
    m = _FUNCTION.match(text, pos)
    if not m or not m[1].strip():
        raise _fail("missing function name" if m else "expected <function=NAME>", text, pos)
    name, pos = m[1].strip(), m.end()
    properties = schemas.get(name, {})
    arguments: dict[str, Any] = {}
    notes = []
    while not (end := _XML_CALL_END.match(text, pos)):
        m = _PARAMETER.match(text, pos)
        if not m or not m[1].strip():
            raise _fail("missing parameter name" if m else "expected <parameter=NAME> or </function>", text, pos)
        key = m[1].strip()
        if key in arguments:
            raise _fail(f"repeated parameter {key!r}", text, pos)
        close = text.find(_PARAMETER_END, m.end())
        if close < 0:
            raise _fail(f"unclosed <parameter={key}>", text, pos)
        arguments[key], note = _convert(_strip_newline(text[m.end():close]), properties.get(key, {}).get("type"))
        if note:
            notes.append(f"{name}.{key}: {note}")
        pos = close + len(_PARAMETER_END)
    return ToolCall(name, arguments), end.end(), notes


_JSON_CALL_END = re.compile(r"\s*</tool_call>")


def _parse_json_call(text: str, pos: int, schemas: Mapping[str, Mapping]) -> tuple[ToolCall, int, list[str]]:
    pos = _skip_ws(text, pos)
    try:
        call, end = _JSON.raw_decode(text, pos)
    except _JSON_ERRORS as e:
        raise _fail(f"invalid JSON ({e})", text, pos) from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise _fail("missing function name", text, pos)
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        raise _fail("arguments are not a JSON object", text, pos)
    if not (close := _JSON_CALL_END.match(text, end)):
        raise _fail("expected </tool_call>", text, end)
    return ToolCall(call["name"], arguments), close.end(), []


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _render_xml_call(call: ToolCall) -> str:
    parameters = "".join(f"<parameter={key}>\n{value if isinstance(value, str) else _json_text(value)}\n</parameter>\n"
                         for key, value in call.arguments.items())
    return f"{CALL_START}\n<function={call.name}>\n{parameters}</function>\n{CALL_END}"


def _render_json_call(call: ToolCall) -> str:
    return f"{CALL_START}\n{_json_text({'name': call.name, 'arguments': call.arguments})}\n{CALL_END}"


class _ToolFormat(NamedTuple):
    parse_call: Callable[[str, int, Mapping[str, Mapping]], tuple[ToolCall, int, list[str]]]
    render_call: Callable[[ToolCall], str]


_QWEN25 = _ToolFormat(_parse_json_call, _render_json_call)
_TOOL_FORMATS = {"qwen3_coder": _ToolFormat(_parse_xml_call, _render_xml_call), "qwen25": _QWEN25, "hermes": _QWEN25}
TOOL_PARSERS = tuple(_TOOL_FORMATS)
REASONING_PARSERS = ("qwen3",)


def validate_parsers(tool_parser: str | None, reasoning_parser: str | None) -> None:
    """Raises ValueError for a parser name that is neither None nor one of the accepted ones."""
    if tool_parser is not None and tool_parser not in TOOL_PARSERS:
        raise ValueError(f"unknown tool parser {tool_parser!r}; accepted: None, {', '.join(TOOL_PARSERS)}")
    if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {reasoning_parser!r}; "
                         f"accepted: None, {', '.join(REASONING_PARSERS)}")


def _parameter_schemas(tools: Sequence[Mapping]) -> dict[str, Mapping]:
    """Function name -> its parameters' JSON schemas, from OpenAI-style tool definitions."""
    functions = (tool.get("function", tool) for tool in tools)
    return {f.get("name"): (f.get("parameters") or {}).get("properties") or {} for f in functions}


def _split_tool_calls(text: str, fmt: _ToolFormat, schemas: Mapping[str, Mapping]
                      ) -> tuple[str, tuple[ToolCall, ...], tuple[str, ...]]:
    """(content, tool calls, notes); raises _IllFormed."""
    start = text.find(CALL_START)
    if start < 0:
        return text, (), ()
    calls, notes, pos = [], [], start
    while pos < len(text):
        if not text.startswith(CALL_START, pos):
            raise _fail("text outside a tool call", text, pos)
        if text.find(CALL_END, pos) < 0:
            raise _fail(f"unclosed {CALL_START}", text, pos)
        call, end, call_notes = fmt.parse_call(text, pos + len(CALL_START), schemas)
        if schemas and call.name not in schemas:
            raise _fail(f"call to unknown function {call.name!r}", text, pos)
        calls.append(call)
        notes += call_notes
        pos = _skip_ws(text, end)
    return text[:start].removesuffix("\n"), tuple(calls), tuple(notes)


def parse_output(text: str, *, tool_parser: str | None, reasoning_parser: str | None,
                 tools: Sequence[Mapping] = ()) -> ParsedOutput:
    """The reasoning, content and tool calls in a model's output text, by the rules above."""
    validate_parsers(tool_parser, reasoning_parser)
    reasoning, rest, truncated = _split_reasoning(text) if reasoning_parser else (None, text, False)
    if tool_parser is None:
        return ParsedOutput(reasoning, rest, truncated_reasoning=truncated)
    try:
        content, calls, notes = _split_tool_calls(rest, _TOOL_FORMATS[tool_parser], _parameter_schemas(tools))
    except _IllFormed as e:
        return ParsedOutput(reasoning, rest, ill_formed=True, truncated_reasoning=truncated, problems=(str(e),))
    return ParsedOutput(reasoning, content, calls, truncated_reasoning=truncated, problems=notes)


def render_output(content: str = "", *, reasoning: str | None = None, tool_calls: Sequence[ToolCall] = (),
                  tool_parser: str | None, reasoning_parser: str | None) -> str:
    """The canonical text of an output: what parse_output reads back exactly, within the limits above."""
    validate_parsers(tool_parser, reasoning_parser)
    if reasoning is not None and reasoning_parser is None:
        raise ValueError("reasoning needs a reasoning parser")
    if tool_calls and tool_parser is None:
        raise ValueError("tool calls need a tool parser")
    calls = ([_TOOL_FORMATS[tool_parser].render_call(call) for call in tool_calls]
             if tool_calls and tool_parser is not None else [])
    body = "\n".join([content, *calls] if content else calls)
    return body if reasoning is None else f"{THINK_START}\n{reasoning}\n{THINK_END}\n\n{body}"
