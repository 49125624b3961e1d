"""What a task's Dockerfile asks of a build, read without building it.

Parsing (line continuations, comments, parser directives, quoting, ARG defaults in FROM) is
dockerfile-parse's, the parser Red Hat's OSBS builds containers with; this module reads its
instructions for what a task needs before any builder runs:

- whether the Dockerfile needs a build at all: FROM, WORKDIR and metadata alone name an image
  that can be used as it is; anything else (RUN, COPY, ENV, USER...) changes the image;
- the images it starts from (FROM lines that are not earlier stages), which a site's registry
  or mirror must serve, and the final stage's WORKDIR, where the agent starts;
- the steps that need the network (RUN, ADD of a URL), which fail on a compute node without it;
- COPY/ADD sources that are not in the build context, refused here, with their line, rather
  than minutes into a build.

`build_key` names a build by its content, the Dockerfile and every file of its context, so
that identical environments (a data set whose tasks share one Dockerfile) build once.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dockerfile_parse import DockerfileParser
from dockerfile_parse.util import WordSplitter

# Instructions that leave the filesystem and the runtime config as the base image has them
METADATA = frozenset({"LABEL", "MAINTAINER", "EXPOSE", "CMD", "ENTRYPOINT", "STOPSIGNAL", "HEALTHCHECK",
                      "ONBUILD", "VOLUME", "SHELL"})
CHANGES = frozenset({"ARG", "ENV", "USER", "RUN", "COPY", "ADD"})
KNOWN = METADATA | CHANGES | {"FROM", "WORKDIR"}
DOCKERFILE = "Dockerfile"
_REFERENCE = re.compile(r"\$(?:\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:[-+])(?P<arg>[^}]*))?\}|(?P<bare>[A-Za-z_]\w*))")


class DockerfileError(ValueError):
    """A Dockerfile this project cannot build; the message names the line and the fix."""


@dataclass(frozen=True)
class Step:
    line: int          # 1-based, where the instruction starts
    op: str
    value: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.op} {self.value}"


@dataclass(frozen=True)
class DockerfilePlan:
    bases: tuple[str, ...]          # the images the build starts from, in order, ARG defaults applied
    workdir: str | None             # the final stage's working directory, if the Dockerfile sets one
    changes: tuple[Step, ...]       # instructions that change the image: it needs a build
    network_steps: tuple[Step, ...]  # RUN and ADD of a URL: they need the network at build time
    stages: int = 1                  # FROM lines
    final_steps: tuple[Step, ...] = ()   # the last stage's instructions after its FROM, in order
    args: tuple[tuple[str, str], ...] = ()   # ARG defaults before the first FROM

    @property
    def needs_build(self) -> bool:
        return bool(self.changes)


def words_of(value: str) -> list[str]:
    """The instruction's words, dequoted, variables left as they are (the shell form) or a JSON array."""
    value = value.strip()
    if value.startswith("["):          # the exec form
        try:
            words = json.loads(value)
        except json.JSONDecodeError:
            words = None
        if isinstance(words, list) and all(isinstance(w, str) for w in words):
            return words
    return list(WordSplitter(value).split())


def substitute(word: str, variables: Mapping[str, str]) -> str | None:
    """`word` with $NAME, ${NAME}, ${NAME:-default} and ${NAME:+alternative} replaced as Docker does;
    None when it names a variable that `variables` lacks (the base image's ENV, which is not known here)."""
    unknown = False

    def value(m: re.Match) -> str:
        nonlocal unknown
        name, op, arg = m.group("name") or m.group("bare"), m.group("op"), m.group("arg") or ""
        if op == ":-":
            return variables.get(name) or arg
        if op == ":+":
            return arg if variables.get(name) else ""
        if name not in variables:
            unknown = True
            return ""
        return variables[name]

    out = _REFERENCE.sub(value, word)
    return None if unknown else out


def assignments(step: Step) -> list[tuple[str, str | None]]:
    """An ARG's or ENV's (name, value) pairs, unsubstituted; None for an ARG without a default.
    ENV's old form, `ENV NAME the value`, is one pair."""
    words = words_of(step.value)
    if step.op == "ENV" and len(words) >= 2 and "=" not in words[0]:
        return [(words[0], " ".join(words[1:]))]
    return [(name, value if sep else None) for name, sep, value in (w.partition("=") for w in words)]


def split_flags(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """(--name=value flags, the other words) of an instruction."""
    flags, rest = {}, list(words)
    while rest and rest[0].startswith("--"):
        name, _, value = rest.pop(0)[2:].partition("=")
        flags[name] = value
    return flags, rest


def _in_context(source: str, files: Iterable[str], step: Step) -> None:
    """A COPY/ADD source must be in the context: a file, a directory holding files, or a glob matching one."""
    norm = posixpath.normpath(source.lstrip("/")) if source not in ("", ".", "/") else "."
    if norm == ".." or norm.startswith("../"):
        raise DockerfileError(f"{step}: {source!r} is outside the build context (the task's environment/ "
                              "directory): copy what it needs into environment/")
    if norm == ".":
        return
    for f in files:
        if f == norm or f.startswith(norm + "/") or fnmatch.fnmatchcase(f, norm) \
                or fnmatch.fnmatchcase(f, norm + "/*"):
            return
    raise DockerfileError(f"{step}: {source!r} is not in the build context (the task's environment/ directory "
                          "holds no such file): add it there, or fix the path")


def plan_dockerfile(text: str, context_files: Iterable[str] = ()) -> DockerfilePlan:
    """The plan of a Dockerfile whose build context holds `context_files` (posix paths, relative)."""
    files = sorted(context_files)
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))
    variables: dict[str, str] = {}      # ARG defaults before the first FROM, then the stage's ARG/ENV
    stages: list[str] = []              # stage names (AS x), lower case, as FROM --from= may name them
    bases: list[str] = []
    changes: list[Step] = []
    network: list[Step] = []
    workdir: str | None = None
    global_args: dict[str, str] = {}
    froms = 0
    stage_steps: list[Step] = []
    for item in parser.structure:
        op = item["instruction"].upper()
        if op == "COMMENT":
            continue
        step = Step(item["startline"] + 1, op, item["value"])
        if op not in KNOWN:
            raise DockerfileError(f"{step}: unknown instruction {op} (known: {', '.join(sorted(KNOWN))})")
        if op == "FROM":
            _, words = split_flags(words_of(step.value))
            substituted = [substitute(w, {k: v for k, v in global_args.items() if v}) for w in words]
            words = [w for w in substituted if w is not None]
            if len(words) < len(substituted):
                raise DockerfileError(f"{step}: uses a variable that no ARG before the first FROM gives a "
                                      "default: give it one")
            named = len(words) == 3 and words[1].upper() == "AS"
            if len(words) != 1 and not named:
                raise DockerfileError(f"{step}: expected FROM IMAGE [AS NAME], got {step.value!r}")
            image = words[0]
            if image.lower() not in stages:
                bases.append(image)
            if froms or image.lower() in stages:
                changes.append(step)     # a multi-stage build: the image is the last stage's
            froms += 1
            if named:
                stages.append(words[2].lower())
            variables, workdir, stage_steps = dict(global_args), None, []
            continue
        if not froms:
            if op != "ARG":
                raise DockerfileError(f"{step}: {op} before the first FROM (only ARG may come first)")
            for name, default in assignments(step):
                global_args[name] = substitute(default or "", global_args) or ""
            continue
        stage_steps.append(step)
        if op == "WORKDIR":
            words = words_of(step.value)
            path = substitute(words[0], variables) if len(words) == 1 else None
            if path is None:
                raise DockerfileError(f"{step}: the working directory {path!r} depends on a variable this cannot "
                                      "resolve: set [environment] workdir in task.toml")
            workdir = posixpath.normpath(posixpath.join(workdir or "/", path))
        elif op in ("ARG", "ENV"):
            for name, value in assignments(step):
                if value is not None:
                    variables[name] = substitute(value, variables) or ""
                else:
                    variables.setdefault(name, global_args.get(name, ""))
        if op in ("COPY", "ADD"):
            flags, words = split_flags(words_of(step.value))
            words = [substitute(w, variables) or w for w in words]
            if len(words) < 2:
                raise DockerfileError(f"{step}: {op} needs a source and a destination")
            if "from" not in flags:
                for source in words[:-1]:
                    if op == "ADD" and source.startswith(("http://", "https://", "git@")):
                        network.append(step)
                    else:
                        _in_context(source, files, step)
        if op == "RUN":
            network.append(step)
        if op in CHANGES:
            changes.append(step)
    if not froms:
        raise DockerfileError("has no FROM line: a Dockerfile starts from an image")
    return DockerfilePlan(tuple(bases), workdir, tuple(changes), tuple(dict.fromkeys(network)), froms,
                          tuple(stage_steps), tuple(global_args.items()))


def plan_context(context: Path) -> DockerfilePlan:
    """The plan of the Dockerfile in a build context directory (`context/Dockerfile`, its files beside it)."""
    files = [p.relative_to(context).as_posix() for p in context.rglob("*") if p.is_file()]
    return plan_dockerfile((context / DOCKERFILE).read_text(), files)


def build_key(files: Mapping[str, bytes], executable: Iterable[str] = (), build_args: Mapping[str, str] | None = None,
              check: str | None = None) -> str:
    """sha256 of a build's content: every file of the context (the Dockerfile among them), which of
    them are executable, the build arguments, and the check the image must pass; equal content,
    equal key."""
    if DOCKERFILE not in files:
        raise DockerfileError(f"the build context has no {DOCKERFILE}")
    doc = {"files": {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())},
           "executable": sorted(set(executable)), "build_args": dict(sorted(dict(build_args or {}).items()))}
    if check is not None:
        doc["check"] = check
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


BUILT_PREFIX = "dockerfile:"


def built_image_name(key: str) -> str:
    """How a task names the image built from its environment: by the build's key, never pulled."""
    return BUILT_PREFIX + key
