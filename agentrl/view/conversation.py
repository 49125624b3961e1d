"""A sample's tokens as a conversation, turn by turn, and as marked tokens. Pure: a decoder is passed in.

The model's turns are where the trace says they are (agentrl.adapter.trajectory.TurnSpan); without a
trace, each run of model tokens (trained, or carrying a weight version) is taken for a turn. Between
them lies what the model was given: the system and user prompts, tool results, the template's
markers, split into messages where the text is ChatML (`<|im_start|>role ... <|im_end|>`). Each
model turn is parsed as the adapter parsed it (agentrl.adapter.parsers): reasoning, text, tool calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..adapter.parsers import parse_output
from ..pool.trace import SpanTrace
from ..sample import UNKNOWN_VERSION, Sample

Decode = Callable[[Sequence[int]], str]
STOPS = ("<|im_end|>", "<|endoftext|>")
_TOOL_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.S)


@dataclass(frozen=True)
class Message:
    role: str            # system, user, tool, or "text": not in a template this knows
    text: str


@dataclass(frozen=True)
class ToolCallView:
    name: str
    arguments: str       # JSON, indented


@dataclass(frozen=True)
class ModelTurn:
    number: int                  # 1-based, on this sample's chain
    start: int                   # response positions of the kept output: [start, start + kept)
    kept: int
    generated: int               # more than kept: a later prompt re-rendered the rest (realign)
    drift: str | None            # how the turn mounted; None without a trace
    trained: bool                # trained in this sample (else in an earlier one of the attempt)
    weight_version: int | None
    reasoning: str | None
    content: str
    tool_calls: tuple[ToolCallView, ...]
    problems: tuple[str, ...]    # why the output did not parse (ill-formed), or notes


Block = Message | ModelTurn


def turn_spans(sample: Sample, chain: list[SpanTrace] | None) -> list[SpanTrace]:
    """The chain's turns from the trace when it fits the sample, else from the runs of model tokens."""
    n = sample.response_length
    if chain and all(0 <= s.start and s.start + s.kept <= n and s.kept <= s.generated for s in chain):
        return chain
    model = (np.asarray(sample.loss_mask) == 1) | (np.asarray(sample.token_versions) != UNKNOWN_VERSION)
    spans, i = [], 0
    while i < n:
        if not model[i]:
            i += 1
            continue
        j = i
        while j < n and model[j]:
            j += 1
        version = int(sample.token_versions[i])
        spans.append(SpanTrace(start=i, generated=j - i, kept=j - i, drift="", trained=bool(sample.loss_mask[i]),
                               weight_version=None if version == UNKNOWN_VERSION else version))
        i = j
    return spans


def split_messages(text: str) -> list[Message]:
    """ChatML text as messages; tool responses as tool messages; what is not ChatML as one "text" message."""
    parts = text.split("<|im_start|>")
    out = [Message("text", parts[0])] if parts[0].strip() else []
    for part in parts[1:]:
        role, _, rest = part.partition("\n")
        body, ended, after = rest.partition("<|im_end|>")
        responses = _TOOL_RESPONSE.findall(body)
        if role == "user" and responses and not _TOOL_RESPONSE.sub("", body).strip():
            out.extend(Message("tool", r) for r in responses)
        elif body.strip() or ended:
            out.append(Message(role.strip() or "text", body))
        if after.strip():
            out.append(Message("text", after))
    return out


def model_turn(number: int, span: SpanTrace, text: str, tool_parser: str | None,
               reasoning_parser: str | None) -> ModelTurn:
    for stop in STOPS:
        if text.endswith(stop):
            text = text[:-len(stop)]
            break
    try:
        parsed = parse_output(text, tool_parser=tool_parser, reasoning_parser=reasoning_parser)
        reasoning, content, problems = parsed.reasoning, parsed.content, parsed.problems
        calls = tuple(ToolCallView(c.name, json.dumps(c.arguments, indent=1, ensure_ascii=False))
                      for c in parsed.tool_calls)
    except ValueError as e:      # the run's parsers are not this version's: the text as it is
        reasoning, content, calls, problems = None, text, (), (f"not parsed: {e}",)
    return ModelTurn(number, span.start, span.kept, span.generated, span.drift or None, span.trained,
                     span.weight_version, reasoning, content, calls, tuple(problems))


def conversation(sample: Sample, spans: list[SpanTrace], decode: Decode, *, tool_parser: str | None,
                 reasoning_parser: str | None) -> list[Block]:
    """The sample's text in order: the messages the model was given, and each of its turns."""
    tokens, base = sample.tokens.tolist(), sample.prompt_length
    blocks: list[Block] = []
    pos = 0
    for number, span in enumerate(spans, start=1):
        blocks.extend(split_messages(decode(tokens[pos:base + span.start])))
        end = base + span.start + span.kept
        blocks.append(model_turn(number, span, decode(tokens[base + span.start:end]), tool_parser, reasoning_parser))
        pos = end
    blocks.extend(split_messages(decode(tokens[pos:])))
    return blocks


# ---------------------------------------------------------------- tokens


@dataclass(frozen=True)
class Cell:
    text: str
    mark: str       # "t": trained (loss_mask 1); "m": the model's, trained elsewhere; "o": prompt or tool
    title: str


def token_cells(sample: Sample, piece: Callable[[int], str], limit: int) -> tuple[list[Cell], list[Cell]]:
    """(prompt cells, response cells), at most `limit` of each; a title holds the position, the id and,
    for a trained token, its log-prob; for the model's tokens, the weight version that wrote them."""
    tokens, base = sample.tokens, sample.prompt_length
    prompt = [Cell(piece(int(t)), "o", f"#{i} id {int(t)}") for i, t in enumerate(tokens[:min(base, limit)])]
    response = []
    for i in range(min(sample.response_length, limit)):
        tid, mask, version = int(tokens[base + i]), int(sample.loss_mask[i]), int(sample.token_versions[i])
        title = f"#{base + i} id {tid}"
        if mask:
            title += f" · logprob {float(sample.rollout_log_probs[i]):.4f}"
        if version != UNKNOWN_VERSION:
            title += f" · weights v{version}"
        response.append(Cell(piece(tid), "t" if mask else "m" if version != UNKNOWN_VERSION else "o", title))
    return prompt, response
