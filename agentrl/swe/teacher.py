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

from ..harness.prompts import PROBLEM_FILE
from ..models.tiny import assistant_text

TURN_START = "<|im_start|>assistant\n"
USER_START = "<|im_start|>user\n"
MISTAKES = ("no-edit", "dry-run")
READ = f"cat {PROBLEM_FILE}"
# The instruction's own fix, run as it stands: the policy reads the hint with the shell, because
# a model of a million parameters trained for minutes does not learn to copy a span (measured: see
# docs/learning.md). `sh` without the pipe is the dry run: the command printed, not run.
FIX = f"grep -o 'sed -i [^`]*' {PROBLEM_FILE} | sh"
LOOK = "grep -n '' */*.py"      # every line of the package and its tests, numbered, with the file's name
TEST = "python3 -m unittest"


def _bash(command: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"command": command}}}]}


def _say(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def plan(mistake: str | None) -> list[dict[str, Any]]:
    """The teacher's assistant turns for one attempt; mistake None is the right repair."""
    if mistake not in (None, *MISTAKES):
        raise ValueError(f"unknown mistake {mistake!r}: one of {MISTAKES} or None")
    if mistake == "no-edit":
        return [_bash(READ), _bash(LOOK), _bash(TEST), _say("The tests pass; nothing to change.")]
    fix = FIX.removesuffix(" | sh") if mistake == "dry-run" else FIX
    return [_bash(READ), _bash(fix), _bash(LOOK), _bash(TEST), _say("Done.")]


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
        turns = plan(self.mistake(sampling_seed))
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
