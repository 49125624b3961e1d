import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentrl.adapter.parsers import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    ParsedOutput,
    ToolCall,
    parse_output,
    render_output,
)

JSON_TYPE = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object", list: "array",
             type(None): "null"}


def tools_for(calls) -> list[dict]:
    def properties(arguments):
        return {key: {"type": JSON_TYPE[type(value)]} for key, value in arguments.items()}
    return [{"type": "function", "function": {"name": call.name, "description": "", "parameters": {
        "type": "object", "properties": properties(call.arguments)}}} for call in calls]


def exactly(parsed: ParsedOutput) -> tuple:
    """Equality that tells True from 1 from 1.0 and sees the order of arguments (dict == does neither)."""
    calls = [(call.name, json.dumps(call.arguments)) for call in parsed.tool_calls]
    return parsed.reasoning, parsed.content, calls, parsed.ill_formed, parsed.truncated_reasoning, parsed.problems


# Markup fragments make collisions with the format's own tags likely rather than astronomically rare.
FRAGMENTS = ["a", " ", "\n", "\n\n", "\t", "<", ">", "/", "=", '"', "{", "\\", "é", "日本", "😀", "<tool_call>",
             "</tool_call>", "<think>", "</think>", "<function=f>", "</function>", "<parameter=x>", "</parameter>"]
texts = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=10).map("".join)
names = st.from_regex(r"[A-Za-z_][\w.-]{0,8}", fullmatch=True)
strings = texts.filter(lambda s: "</parameter>" not in s)  # the one thing a qwen3_coder value cannot hold
scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
           | strings)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=3),
                      max_leaves=6)
calls = st.lists(st.tuples(names, st.dictionaries(names, values, max_size=4)), max_size=3).map(
    # Unique names, so that each function has one schema.
    lambda pairs: tuple(ToolCall(f"{name}{i}", arguments) for i, (name, arguments) in enumerate(pairs)))


@pytest.mark.parametrize("reasoning_parser", [*REASONING_PARSERS, None])
@pytest.mark.parametrize("tool_parser", ["qwen3_coder", "qwen25"])
@settings(deadline=None)
@given(reasoning=st.none() | texts.filter(lambda s: "</think>" not in s),
       content=texts.filter(lambda s: "<tool_call>" not in s), tool_calls=calls)
def test_parse_reads_back_what_render_wrote(tool_parser, reasoning_parser, reasoning, content, tool_calls):
    if reasoning_parser is None:
        reasoning = None
    text = render_output(content, reasoning=reasoning, tool_calls=tool_calls, tool_parser=tool_parser,
                         reasoning_parser=reasoning_parser)
    if reasoning_parser and reasoning is None:
        assume("</think>" not in text and not text.startswith("<think>"))
    parsed = parse_output(text, tool_parser=tool_parser, reasoning_parser=reasoning_parser,
                          tools=tools_for(tool_calls))
    assert exactly(parsed) == exactly(ParsedOutput(reasoning, content, tool_calls))


def test_canonical_renderings():
    call = ToolCall("edit", {"path": "a.py", "text": "x\n<y>", "n": 2, "ok": True, "o": {"k": ["é"]}})
    assert render_output("Doing it.", reasoning="hm", tool_calls=[call, ToolCall("stop", {})],
                         tool_parser="qwen3_coder", reasoning_parser="qwen3") == (
        "<think>\nhm\n</think>\n\nDoing it.\n"
        "<tool_call>\n<function=edit>\n<parameter=path>\na.py\n</parameter>\n<parameter=text>\nx\n<y>\n</parameter>\n"
        '<parameter=n>\n2\n</parameter>\n<parameter=ok>\ntrue\n</parameter>\n'
        '<parameter=o>\n{"k": ["é"]}\n</parameter>\n'
        "</function>\n</tool_call>\n<tool_call>\n<function=stop>\n</function>\n</tool_call>")
    assert render_output(tool_calls=[ToolCall("run", {"cmd": "ls"})], tool_parser="qwen25", reasoning_parser=None) == (
        '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls"}}\n</tool_call>')


def qwen3(text: str) -> ParsedOutput:
    return parse_output(text, tool_parser=None, reasoning_parser="qwen3")


def test_reasoning_rules():
    assert qwen3("<think>\nhm\n</think>\n\nhi") == ParsedOutput("hm", "hi")
    assert qwen3("<think>hm</think>hi") == ParsedOutput("hm", "hi")
    assert qwen3("<think>\n\nhm\n\n</think>\n\n\n\nhi") == ParsedOutput("\nhm\n", "\n\nhi")
    # <think> was in the generation prompt.
    assert qwen3("hm\n</think>\n\nhi") == ParsedOutput("hm", "hi")
    assert qwen3("a <think>b</think>c") == ParsedOutput("a <think>b", "c")
    assert qwen3("<think>\nhm</think>hi</think>") == ParsedOutput("hm", "hi</think>")
    assert qwen3("just text") == ParsedOutput(None, "just text")
    assert qwen3("") == ParsedOutput(None, "")
    assert parse_output("<think>hm</think>hi", tool_parser=None, reasoning_parser=None) == ParsedOutput(
        None, "<think>hm</think>hi")


def test_unclosed_reasoning_is_truncated_not_ill_formed():
    assert qwen3("<think>\nstill thinking <tool_call>") == ParsedOutput(
        "still thinking <tool_call>", "", truncated_reasoning=True)


def test_tool_calls_are_not_looked_for_in_reasoning():
    text = "<think>\nmaybe <tool_call>{oops\n</think>\n\nNo call."
    assert parse_output(text, tool_parser="qwen25", reasoning_parser="qwen3") == ParsedOutput(
        "maybe <tool_call>{oops", "No call.")


def test_empty_text():
    for tool_parser in TOOL_PARSERS:
        assert parse_output("", tool_parser=tool_parser, reasoning_parser="qwen3") == ParsedOutput(None, "")


SCHEMA = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "s": {"type": "string"}, "i": {"type": "integer"}, "b": {"type": "boolean"}, "o": {"type": "object"},
    "u": {"type": ["integer", "null"]}}}}}]


def xml_call(name: str, **raw_values: str) -> str:
    parameters = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in raw_values.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


def coder(text: str, tools=SCHEMA) -> ParsedOutput:
    return parse_output(text, tool_parser="qwen3_coder", reasoning_parser=None, tools=tools)


def test_qwen3_coder_values_follow_the_schema_in_order():
    parsed = coder(xml_call("f", u="null", s="123", o='{"a": [1]}', i="7", b="false", extra="[1, 2]"))
    assert parsed.tool_calls == (ToolCall("f", {"u": None, "s": "123", "o": {"a": [1]}, "i": 7, "b": False,
                                                "extra": [1, 2]}),)
    assert list(parsed.tool_calls[0].arguments) == ["u", "s", "o", "i", "b", "extra"]
    assert not parsed.problems and not parsed.ill_formed


def test_qwen3_coder_keeps_an_unparsable_typed_value_as_text_with_a_note():
    parsed = coder(xml_call("f", i="seven", s="ok"))
    assert parsed.tool_calls == (ToolCall("f", {"i": "seven", "s": "ok"}),)
    assert not parsed.ill_formed
    assert len(parsed.problems) == 1 and "f.i: not integer" in parsed.problems[0]


def test_qwen3_coder_without_schema_reads_json_literals_but_not_json_strings():
    parsed = coder(xml_call("g", a="5", b="true", c="[1]", d="null", e="hello", f='"q"', g="NaN", h="1.5e3"), tools=())
    assert exactly(parsed) == exactly(ParsedOutput(None, "", (ToolCall("g", {
        "a": 5, "b": True, "c": [1], "d": None, "e": "hello", "f": '"q"', "g": "NaN", "h": 1500.0}),)))


def test_qwen3_coder_string_values_may_hold_tool_call_tags_and_newlines():
    value = "\n  line1\n<tool_call>\n<function=f>\n</tool_call>\n</function>\n\n"
    parsed = coder("Sure.\n" + xml_call("f", s=value) + "\n\n" + xml_call("f", s="") + "\n \n")
    assert parsed == ParsedOutput(None, "Sure.", (ToolCall("f", {"s": value}), ToolCall("f", {"s": ""})))


def test_qwen25_strings_may_hold_tool_call_tags_and_hermes_is_an_alias():
    text = 'Run:\n<tool_call>\n{"name": "run", "arguments": {"cmd": "echo </tool_call>\\n<tool_call>"}}\n</tool_call>\n'
    expected = ParsedOutput(None, "Run:", (ToolCall("run", {"cmd": "echo </tool_call>\n<tool_call>"}),))
    for parser in ("qwen25", "hermes"):
        assert parse_output(text, tool_parser=parser, reasoning_parser=None) == expected


BAD = [
    ("qwen3_coder", "hi\n" + xml_call("nope", s="x"), "unknown function 'nope'"),
    ("qwen3_coder", "hi\n<tool_call>\n<function=f>\n<parameter=s>\nx", "unclosed <tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=s>\nx\n</tool_call>", "unclosed <parameter=s>"),
    ("qwen3_coder", "<tool_call>\n<function=f>\n</tool_call>", "expected <parameter=NAME> or </function>"),
    ("qwen3_coder", "<tool_call>\nf(s=1)\n</tool_call>", "expected <function=NAME>"),
    ("qwen3_coder", "<tool_call>\n<function= >\n</function>\n</tool_call>", "missing function name"),
    ("qwen3_coder", xml_call("f", **{" ": "x"}), "missing parameter name"),
    ("qwen3_coder", xml_call("f", s="x").replace("</function>", "<parameter=s>\ny\n</parameter>\n</function>"),
     "repeated parameter 's'"),
    # The documented limit: a value ends at the first </parameter>.
    ("qwen3_coder", xml_call("f", s="a</parameter>b"), "expected <parameter=NAME> or </function>"),
    ("qwen3_coder", xml_call("f", s="x") + "\nand then", "text outside a tool call"),
    ("qwen3_coder", xml_call("f", s="x") + " between " + xml_call("f", s="y"), "text outside a tool call"),
    ("qwen25", '<tool_call>\n{"name": "f", "arguments": {}}', "unclosed <tool_call>"),
    ("qwen25", '<tool_call>\n{"name": "f", "arguments": {</tool_call>', "invalid JSON"),
    ("qwen25", '<tool_call>\n{"name": "f", "arguments": {"i": NaN}}\n</tool_call>', "invalid JSON"),
    ("qwen25", '<tool_call>\n{"arguments": {}}\n</tool_call>', "missing function name"),
    ("qwen25", '<tool_call>\n{"name": "f", "arguments": "{}"}\n</tool_call>', "arguments are not a JSON object"),
    ("qwen25", '<tool_call>\n{"name": "f"} trailing\n</tool_call>', "expected </tool_call>"),
    ("qwen25", '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', "unknown function 'nope'"),
    ("qwen25", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\nP.S.', "text outside a tool call"),
]


@pytest.mark.parametrize(("tool_parser", "text", "problem"), BAD)
def test_ill_formed_tool_calls_keep_all_text_as_content(tool_parser, text, problem):
    parsed = parse_output(text, tool_parser=tool_parser, reasoning_parser=None, tools=SCHEMA)
    assert parsed == ParsedOutput(None, text, ill_formed=True, problems=parsed.problems)
    assert len(parsed.problems) == 1 and problem in parsed.problems[0]


def test_ill_formed_content_is_the_text_after_the_reasoning():
    rest = '<tool_call>\n{"name": "f"'
    parsed = parse_output(f"<think>\nhm\n</think>\n\n{rest}", tool_parser="qwen25", reasoning_parser="qwen3")
    assert (parsed.reasoning, parsed.content, parsed.tool_calls, parsed.ill_formed) == ("hm", rest, (), True)


def test_any_function_is_accepted_without_tools():
    parsed = parse_output('<tool_call>\n{"name": "any"}\n</tool_call>', tool_parser="qwen25", reasoning_parser=None)
    assert parsed == ParsedOutput(None, "", (ToolCall("any", {}),))


def test_unknown_parser_names_are_rejected_naming_the_accepted_ones():
    with pytest.raises(ValueError, match="qwen3_coder, qwen25, hermes"):
        parse_output("", tool_parser="qwen3", reasoning_parser=None)
    with pytest.raises(ValueError, match="accepted: None, qwen3"):
        render_output("", tool_parser=None, reasoning_parser="deepseek-r1")


def test_render_refuses_what_its_parsers_could_not_read_back():
    with pytest.raises(ValueError, match="reasoning parser"):
        render_output("", reasoning="hm", tool_parser=None, reasoning_parser=None)
    with pytest.raises(ValueError, match="tool parser"):
        render_output("", tool_calls=[ToolCall("f", {})], tool_parser=None, reasoning_parser=None)
