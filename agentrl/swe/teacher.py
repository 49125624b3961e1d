"""A scripted teacher for the pyfix-hint family, served as a model: the demonstrations of `make learn`.

The teacher stands where a stronger model would: behind /generate, so that an agent's session goes
through the real adapter and its samples are recorded token-exact, as any model's would be
(`agentrl eval MODEL --tasks T` with `eval.engine: teacher` and `eval.save_samples: true`). With
the task in PROBLEM_STATEMENT.md (`prompt_style: instruction`) it reads the statement, runs the fix
the statement gives (FIX), looks at the code, runs the tests and stops. It is right only `accuracy`
of the time: otherwise it makes one mistake from MISTAKES (it forgets the fix, or only prints it),
so that a policy warm-started on it succeeds sometimes and the verifier has the rest to teach. An
attempt's choice is a function of the teacher's seed and the request's sampling_seed, the same for
all its turns, so a re-run records the same trajectories.

It answers in the protocol its prompt asks for, as a stronger model would (`protocol`): tool calls
to `bash` (the builtin agent), to `terminal` (OpenHands), or mini-swe-agent's, whose every
reply must hold one action and whose session ends only with its submit command: with tool calls
(`mini_swe_agent`), or as one fenced ```mswea_bash_command block with a THOUGHT before it
(`mini_swe_agent_text`).

Replies are encoded with the tiny model's chat template (agentrl/models/tiny.py): the teacher
serves the tokenizer of the model that will learn from it. Its log-probs are 0 (it is sure of every
token); `agentrl sft` does not read them.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any, cast

from hpc.inference.cpu_server import Engine
from hpc.inference.generation import GenerateRequest, generate_reply

from ..harness.mini_swe_agent import SUBMIT as MINI_SUBMIT
from ..harness.prompts import PROBLEM_FILE
from ..models.tiny import assistant_text
from .mutate.issue import PATCH_FENCE

TURN_START = "<|im_start|>assistant\n"
USER_START = "<|im_start|>user\n"
MISTAKES = ("no-edit", "dry-run")
READ = f"cat {PROBLEM_FILE}"
# The instruction's own fix, run as it stands: the policy reads the hint with the shell, because
# a model of a million parameters trained for minutes does not learn to copy a span (measured: see
# docs/learning.md). `sh` without the pipe is the dry run: the command printed, not run.
FIX = f"grep -o 'sed -i [^`]*' {PROBLEM_FILE} | sh"
# A commit's task gives its fix as a patch between PATCH_FENCE and the next fence (issue.patch_hint); GNU
# sed's \x60 is the backquote, kept out of the command so that no protocol's own fences meet it.
FIX_PATCH = f"sed -n '/^\\x60\\x60\\x60diff$/,/^\\x60\\x60\\x60$/{{//!p}}' {PROBLEM_FILE} | git apply"
LOOK = "grep -n '' */*.py"      # every line of the package and its tests, numbered, with the file's name
TEST = "python3 -m unittest"
PROTOCOLS = ("tool", "mini", "mini_text", "terminal")
MINI_TEXT_BLOCK = "mswea_bash_command"     # mini_textbased.yaml's action: the one fenced block of this kind
TERMINAL_TOOL = '"name": "terminal"'       # OpenHands' shell tool, as the chat template renders its declaration


def _bash(command: str, tool: str = "bash") -> dict[str, Any]:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": tool, "arguments": {"command": command}}}]}


def _say(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def _text_action(command: str) -> dict[str, Any]:
    return _say(f"THOUGHT: The next step.\n\n```{MINI_TEXT_BLOCK}\n{command}\n```")


def protocol(prompt: str) -> str:
    """The protocol a prompt asks for: mini-swe-agent's text format, its tool calls, OpenHands' terminal, or
    plain tool calls."""
    if f"```{MINI_TEXT_BLOCK}" in prompt:
        return "mini_text"
    if MINI_SUBMIT in prompt:
        return "mini"
    return "terminal" if TERMINAL_TOOL in prompt else "tool"


def plan(mistake: str | None, protocol: str = "tool", fix: str = FIX) -> list[dict[str, Any]]:
    """The teacher's assistant turns for one attempt; mistake None is the right repair, `fix` its command (the
    dry run is its first part, before the last pipe: the fix printed, not made)."""
    if mistake not in (None, *MISTAKES):
        raise ValueError(f"unknown mistake {mistake!r}: one of {MISTAKES} or None")
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}: one of {PROTOCOLS}")
    if mistake == "no-edit":
        commands, last = [READ, LOOK, TEST], "The tests pass; nothing to change."
    else:
        commands, last = [READ, fix.rsplit(" | ", 1)[0] if mistake == "dry-run" else fix, LOOK, TEST], "Done."
    if protocol in ("tool", "terminal"):
        return [*(_bash(c, "bash" if protocol == "tool" else "terminal") for c in commands), _say(last)]
    # mini-swe-agent ends a session only at its submit command: a reply without an action is a format error
    commands.append(f"echo {MINI_SUBMIT}")
    return [*map(_text_action if protocol == "mini_text" else _bash, commands)]


class Teacher:
    def __init__(self, accuracy: float, seed: int = 0):
        if not 0 <= accuracy <= 1:
            raise ValueError(f"the teacher's accuracy must be in [0, 1], got {accuracy}")
        self.accuracy, self.seed = accuracy, seed

    def mistake(self, sampling_seed: int | None) -> str | None:
        digest = hashlib.sha256(f"{self.seed}/{sampling_seed}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "little"))
        return None if rng.random() < self.accuracy else rng.choice(MISTAKES)

    def reply(self, prompt: str, sampling_seed: int | None) -> dict[str, Any]:
        """The next assistant turn for a chat-templated prompt that ends with the generation prompt."""
        user = prompt.find(USER_START)
        if user < 0 or PROBLEM_FILE not in prompt[user:]:
            return _say(f"The teacher acts on tasks given in {PROBLEM_FILE} (prompt_style: instruction) only.")
        # The statement is in the prompt once READ has run, which is before the fix in every plan
        fix = FIX_PATCH if PATCH_FENCE in prompt[user:] else FIX
        turns = plan(self.mistake(sampling_seed), protocol(prompt), fix)
        done = prompt[user:].count(TURN_START) - 1      # the generation prompt is the last one
        return turns[min(max(done, 0), len(turns) - 1)]


class TeacherEngine(Engine):
    """The CPU server's engine with the teacher's turns in place of the model's samples."""

    def __init__(self, model_dir: Path | str, *, accuracy: float, seed: int = 0, weight_version: str = "default"):
        super().__init__(model_dir, weight_version=weight_version, random_seed=seed)
        self.teacher = Teacher(accuracy, seed)
        self.stop_id = self.tokenizer.convert_tokens_to_ids(self.tokenizer.eos_token)

    def generate(self, request: GenerateRequest, ticket: int) -> dict[str, Any]:
        # transformers types decode's result str | list[str] for every input: one id list decodes to a str
        prompt = cast(str, self.tokenizer.decode(list(request.input_ids), skip_special_tokens=False))
        message = self.teacher.reply(prompt, request.sampling.seed)
        ids = self.tokenizer.encode(assistant_text(message), add_special_tokens=False) + [self.stop_id]
        limit = request.sampling.max_new_tokens
        if len(ids) > limit:
            ids, finish = ids[:limit], {"type": "length", "length": limit}
        else:
            finish = {"type": "stop", "matched": self.stop_id}
        text = cast(str, self.tokenizer.decode(ids[:-1] if finish["type"] == "stop" else ids, skip_special_tokens=True))
        return generate_reply(request, ids, [0.0] * len(ids), finish, text=text, weight_version=self.weight_version)

    def load_weights(self, model_path: str, weight_version: str | None) -> tuple[bool, str]:
        return False, "the scripted teacher has no weights to update"
