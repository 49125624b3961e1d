"""Every command the README (and docs/, configs/README.md) shows exists as shown: each `agentrl ...`
line's subcommand, its flags and its choices against the real parser; each `make ...` target and
variable against the Makefile; each `python tools/X.py` and `python -m benchmarks.X` script and its flags
against its source.

The commands are taken from the shell code blocks and the `inline code`; placeholders (CONFIG, RUN_DIR)
are values, never checked, so what is checked is the words a user copies: command, flag, choice.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from agentrl.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PYTHON = re.compile(r"(?:\.venv/bin/)?python3? (?:-m (benchmarks\.\w+|tools\.\w+)|((?:benchmarks|tools)/\w+\.py))")


def command_lines(markdown: str) -> list[str]:
    """The README's shell lines: each code block's lines (comments cut) and each inline code span."""
    out = []
    fence = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
    for language, block in fence.findall(markdown):
        if language in ("", "bash", "sh"):
            out += [re.sub(r"\s#\s.*$", "", line).strip() for line in block.splitlines()]
    out += re.findall(r"`([^`\n]+)`", fence.sub("", markdown))
    return [line for line in out if line and not line.startswith("#")]


def commands(line: str, word: str) -> list[list[str]]:
    """Each `word ...` command in a shell line, as its words up to the end of that command."""
    out = []
    for m in re.finditer(rf"(?:^|;\s*|&&\s*|\|\s*|\$\()(?:[A-Z_]+=\S+\s+)*{word} ", line):
        rest = re.split(r"\s*(?:;|&&|\)|\"|\s#\s)", line[m.end():])[0]
        out.append([w.strip("[]") for w in rest.split() if w.strip("[]")])
    return out


def _leaf(parser: argparse.ArgumentParser, words: list[str]) -> tuple[argparse.ArgumentParser, list[str], str]:
    """The subcommand's parser the words reach, the words after it, and its path."""
    path = []
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or not words or words[0] not in subs[0].choices:
            if subs:
                raise KeyError(f"`agentrl {' '.join(path + words[:1])}`: no such command "
                               f"(agentrl {' '.join(path)} has {', '.join(subs[0].choices)})")
            return parser, words, " ".join(path)
        path.append(words[0])
        parser, words = subs[0].choices[words[0]], words[1:]


def agentrl_problems(words: list[str], parser: argparse.ArgumentParser) -> list[str]:
    try:
        leaf, rest, path = _leaf(parser, words)
    except KeyError as e:
        return [e.args[0]]
    flags = {s for a in leaf._actions for s in a.option_strings}
    problems = [f"`agentrl {path}` has no flag {w.split('=')[0]}"
                for w in rest if w.startswith("-") and w.split("=")[0] not in flags]
    positional = [a for a in leaf._actions if not a.option_strings]
    bare = [w for w in rest if not w.startswith("-")]
    choices = positional[0].choices if positional else None
    for shown in bare[0].split("|") if choices and bare else ():     # `up|down` shows each choice
        if shown not in choices:
            problems.append(f"`agentrl {path} {shown}`: {positional[0].dest} is one of {', '.join(map(str, choices))}")
    return problems


def make_problems(words: list[str], makefile: str) -> list[str]:
    targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.M))
    problems = []
    for w in words:
        if w.startswith("-"):
            continue
        if "=" in w:
            var = w.split("=")[0]
            if f"$({var})" not in makefile:
                problems.append(f"`make {' '.join(words)}`: the Makefile reads no variable {var}")
        elif re.fullmatch(r"[\w-]+", w) and w not in targets:
            problems.append(f"`make {w}`: the Makefile has no such target")
    return problems


def python_problems(line: str, root: Path) -> list[str]:
    problems = []
    for m in PYTHON.finditer(line):
        rel = m.group(2) or m.group(1).replace(".", "/") + ".py"
        if re.fullmatch(r"[A-Z_]+", Path(rel).stem):      # `python -m benchmarks.NAME`: a placeholder
            continue
        script = root / rel
        if not script.is_file():
            problems.append(f"`{m.group(0)}`: there is no {rel}")
            continue
        source = script.read_text() + (root / "benchmarks/common.py").read_text()
        rest = re.split(r"\s*(?:;|&&|\s#\s)", line[m.end():])[0]
        problems += [f"`{m.group(0)}` has no flag {w}" for w in re.findall(r"(?<![\w-])--[\w-]+", rest)
                     if f'"{w}"' not in source]
    return problems


def readme_problems(markdown: str, root: Path = ROOT) -> list[str]:
    parser = build_parser()
    makefile = (root / "Makefile").read_text()
    problems = []
    for line in command_lines(markdown):
        for words in commands(line, "agentrl"):
            problems += agentrl_problems(words, parser)
        for words in commands(line, "make"):
            problems += make_problems(words, makefile)
        problems += python_problems(line, root)
    return problems


DOCS = ["README.md", "configs/README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]


def test_every_command_the_readme_shows_exists_as_shown():
    readme = (ROOT / "README.md").read_text()
    shown = [w for line in command_lines(readme) for w in commands(line, "agentrl")]
    assert len(shown) > 20, "the README's agentrl commands were not found: the extraction is broken"
    assert readme_problems(readme) == []


@pytest.mark.parametrize("doc", DOCS[1:])
def test_every_command_the_docs_show_exists_as_shown(doc):
    assert readme_problems((ROOT / doc).read_text()) == []


@pytest.mark.parametrize("line,problem", [
    ("agentrl tasks chek agentrl/swe/bundled_tasks/", "`agentrl tasks chek`: no such command"),
    ("agentrl tasks check --leak DIR", "`agentrl tasks check` has no flag --leak"),
    ("agentrl launch CONFIG --executor sbatch --dryrun", "`agentrl launch` has no flag --dryrun"),
    ('eval "$(agentrl cluster upp)"', "`agentrl cluster upp`: action is one of"),
    ("agentrl cluster up|dwn", "`agentrl cluster dwn`: action is one of"),
    ("agentrl status RUN ; agentrl reprot RUN", "`agentrl reprot`: no such command"),
    ("make learn HARNES=mini", "the Makefile reads no variable HARNES"),
    ("make gpu-chek", "`make gpu-chek`: the Makefile has no such target"),
    ("python -m benchmarks.ledger_bench --dirs /x", "has no flag --dirs"),
    ("python tools/make_tiny_modle.py /tmp/t", "there is no tools/make_tiny_modle.py"),
])
def test_a_command_flag_or_target_the_code_lacks_is_named(line, problem):
    for shown in (f"```bash\n{line}   # a comment\n```\n", f"Run `{line}` first.\n"):
        got = readme_problems(shown)
        assert len(got) == 1 and problem in got[0], (shown, got)
