"""The pages as HTML strings, from the viewer's data (templates/*.html). Pure: site.py decides what to write where.

Jinja autoescapes every value: an agent's output, a tool's, a task name or a grader's output is text,
never markup (a `<script>` or a `</textarea>` in it shows as those characters).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from ..sample import Sample
from .conversation import Block, Cell, Decode, conversation, token_cells, turn_spans
from .model import Attempt, AttemptRef, AttemptRow, Figures
from .tokens import Decoder

TOKEN_LIMIT = 20_000       # tokens shown per sample (of its prompt, and of its response)


def _num(value: Any) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return "–"
    if isinstance(value, int):
        return str(value)
    return f"{value:.0f}" if abs(value) >= 1e4 else f"{value:.3g}"


def _reward_class(value: Any) -> str:
    return "" if not isinstance(value, int | float) else "good" if value > 0 else "bad"


TEMPLATES = Path(__file__).parent / "templates"     # package data (setup.cfg)
ENV = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined, trim_blocks=True,
                  lstrip_blocks=True)
ENV.filters.update(num=_num, reward_class=_reward_class)


def templates_digest() -> str:
    """What the templates are now: pages written from others are written again."""
    digest = hashlib.sha256()
    for path in sorted(TEMPLATES.glob("*.html")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _written() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def diff_lines(patch: str) -> list[tuple[str, str]]:
    """(class, line) of a unified diff: fh file headers, hk hunks, add, del, ctx."""
    out = []
    for line in patch.splitlines():
        if line.startswith(("diff --git", "index ", "--- ", "+++ ", "new file", "deleted file", "similarity",
                            "rename ", "old mode", "new mode", "GIT binary patch", "Binary files")):
            cls = "fh"
        elif line.startswith("@@"):
            cls = "hk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = "ctx"
        out.append((cls, line))
    return out


@dataclass(frozen=True)
class DiffFile:
    name: str                       # its `diff --git` line, or "" for text before the first
    lines: list[tuple[str, str]]
    binary: bool                    # a binary patch (base85): collapsed on the page


def diff_files(patch: str) -> list[DiffFile]:
    """The diff split per file, so that a file of base85 (a binary patch: bytecode, say) can be collapsed."""
    files: list[DiffFile] = []
    current: list[tuple[str, str]] = []
    for cls, line in diff_lines(patch):
        if line.startswith("diff --git") and current:
            files.append(_diff_file(current))
            current = []
        current.append((cls, line))
    if current:
        files.append(_diff_file(current))
    return files


def _diff_file(lines: list[tuple[str, str]]) -> DiffFile:
    first = lines[0][1]
    return DiffFile(first if first.startswith("diff --git") else "", lines,
                    any(line == "GIT binary patch" or line.startswith("Binary files") for _, line in lines))


# ---------------------------------------------------------------- the index and the listings


@dataclass(frozen=True)
class ListingLink:
    name: str                 # "rollout 3", "iter_2"
    href: str
    state: str
    figures: Figures


def render_index(run_name: str, source: str, rollouts: list[ListingLink], evals: list[ListingLink],
                 problems: list[str], decoder_note: str | None) -> str:
    return ENV.get_template("index.html").render(
        root="", run_name=run_name, source=source, rollouts=rollouts, evals=evals, problems=problems,
        decoder_note=decoder_note, written=_written())


def render_listing(run_name: str, title: str, state: str, figures: Figures, rows: list[AttemptRow],
                   problems: list[str]) -> str:
    classes = sorted({r.empty_patch for r in rows if r.empty_patch})
    return ENV.get_template("listing.html").render(
        root="../", run_name=run_name, title=title, state=state, figures=figures, rows=rows, classes=classes,
        problems=problems, written=_written())


# ---------------------------------------------------------------- an attempt


@dataclass
class SampleView:
    prompt_length: int
    response_length: int
    trained: int
    versions: str
    truncated: bool
    blocks: list[Block]
    prompt_cells: list[Cell]
    response_cells: list[Cell]
    events: list[dict[str, str]] = field(default_factory=list)
    cut: str = ""

    @property
    def turns(self) -> list[Block]:
        return [b for b in self.blocks if not hasattr(b, "role")]


def _versions(sample: Sample) -> str:
    found = sorted({int(v) for v in sample.token_versions if v >= 0})
    return ", ".join(f"v{v}" for v in found)


def sample_view(sample: Sample, index: int, chain: list | None, decoder: Decoder,
                parsers: tuple[str | None, str | None]) -> SampleView:
    spans = turn_spans(sample, chain)
    decode: Decode = decoder.decode
    blocks = (conversation(sample, spans, decode, tool_parser=parsers[0], reasoning_parser=parsers[1])
              if decoder.decodes else [])
    prompt, response = token_cells(sample, decoder.piece, TOKEN_LIMIT)
    events = []
    if index and spans and spans[0].drift == "fork":
        events.append({"kind": "fork", "text": "fork: this sample's first turn continued no earlier turn's text "
                       "(the agent rewrote its history), so it starts a sample of its own."})
    elif index and spans and spans[0].drift == "root":
        events.append({"kind": "branch", "text": "a branch: this chain shares its first turns with an earlier "
                       "sample, which trains them; this one trains its own turns only."})
    realigns = [n for n, s in enumerate(spans, start=1) if s.kept < s.generated]
    if realigns:
        events.append({"kind": "realign", "text": "realign after model turn" + ("s " if len(realigns) > 1 else " ")
                       + ", ".join(map(str, realigns)) + ": the next prompt re-rendered the end of the output "
                       "differently; only the tokens before the difference are trained."})
    cut = []
    for part, n in (("prompt", sample.prompt_length), ("response", sample.response_length)):
        if n > TOKEN_LIMIT:
            cut.append(f"the {part}'s tokens past the first {TOKEN_LIMIT} are not shown ({n - TOKEN_LIMIT} more)")
    return SampleView(sample.prompt_length, sample.response_length, int(sample.loss_mask.sum()), _versions(sample),
                      bool(sample.metadata.truncated), blocks, prompt, response, events, "; ".join(cut))


def render_attempt(run_name: str, listing_title: str, attempt: Attempt, row: AttemptRow, decoder: Decoder,
                   decoder_note: str | None, parsers: tuple[str | None, str | None]) -> str:
    trace = attempt.trace
    chains = trace.chains if trace is not None and len(trace.chains) == len(attempt.samples) else None
    problems = list(attempt.problems)
    if trace is not None and chains is None and attempt.samples:
        problems.append(f"the trace lists {len(trace.chains)} chains for {len(attempt.samples)} samples: "
                        "turns are found from the tokens instead")
    samples = [sample_view(s, i, chains[i] if chains else None, decoder, parsers)
               for i, s in enumerate(attempt.samples)]
    ref: AttemptRef = attempt.ref
    return ENV.get_template("attempt.html").render(
        root="../", run_name=run_name, listing_title=listing_title, ref=ref, row=row, trace=trace,
        diff=diff_files(trace.patch.text) if trace is not None else [], samples=samples, problems=problems,
        decoder_note=decoder_note, written=_written())
