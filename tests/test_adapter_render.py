"""Incremental chat rendering equals a full render, and templates where it would not are caught."""

import random

import pytest
from jinja2 import Environment

from agentrl.adapter.render import ChatRenderer, incremental_problem
from agentrl.models.tiny import render_chat

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

TOOLS = [{"type": "function", "function": {"name": "run", "description": "d",
                                           "parameters": {"type": "object", "properties": {}}}}]


def tiny_render(messages, tools):
    return render_chat(messages, tools=tools or None, add_generation_prompt=True)


def jinja_render(source):
    template = Environment().from_string(source)
    return lambda messages, tools: template.render(messages=messages, tools=tools, add_generation_prompt=True)


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Qwen3's habit: reasoning only after the last user message; earlier turns lose theirs.
DROPS_OLD_REASONING = (
    "{% set ns = namespace(last=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}"
    "{% endif %}{% endfor %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content and loop.index0 > ns.last %}<think>{{ m.reasoning_content }}"
    "</think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
# Passes the probes, but once a message says MAGIC it re-renders every assistant turn: only verification
# finds that.
SNEAKY = ("{% set magic = messages | selectattr('content', 'equalto', 'MAGIC') | list %}"
          "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if magic and m.role == 'assistant' %}*{% endif %}"
          "{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")


def random_session(rng, turns):
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    history = [list(messages)]
    for t in range(turns):
        reply = {"role": "assistant", "content": rng.choice(["", "text ü", "multi\nline"]),
                 "reasoning_content": rng.choice(["", f"why {t}"])}
        if rng.random() < 0.6:
            n = rng.randint(1, 3)
            reply["tool_calls"] = [{"id": f"c{t}{i}", "type": "function",
                                    "function": {"name": "run", "arguments": {"cmd": f"ls {i}", "n": i}}}
                                   for i in range(n)]
            messages = messages + [reply] + [{"role": "tool", "tool_call_id": f"c{t}{i}", "content": f"out {i}"}
                                             for i in range(n)]
        else:
            messages = messages + [reply, {"role": "user", "content": rng.choice(["go on", "<|im_end|> odd"])}]
        history.append(list(messages))
    return history


@pytest.mark.parametrize("seed", range(3))
def test_incremental_renders_equal_full_renders_over_long_sessions(tiny_model, seed):
    assert incremental_problem(tiny_render) is None
    rng = random.Random(seed)
    renderer = ChatRenderer(tiny_render, check=False, verify_every=0)
    for messages in random_session(rng, 60):
        tools = TOOLS if seed != 1 else []
        assert renderer.render(messages, tools) == tiny_render(messages, tools)
    assert renderer.incremental == 60 and renderer.full == 1


def test_a_rewritten_history_or_changed_tools_render_whole(tiny_model):
    sessions = random_session(random.Random(7), 4)
    renderer = ChatRenderer(tiny_render, check=False)
    renderer.render(sessions[2], TOOLS)
    rewritten = [dict(m) for m in sessions[3]]
    rewritten[1]["content"] = "a compacted summary"
    assert renderer.render(rewritten, TOOLS) == tiny_render(rewritten, TOOLS)
    assert renderer.render(sessions[4], []) == tiny_render(sessions[4], [])
    assert renderer.full == 3 and renderer.incremental == 0


def test_templates_that_look_back_are_rendered_whole():
    assert incremental_problem(jinja_render(CHATML)) is None
    assert "differs from a full render" in incremental_problem(jinja_render(DROPS_OLD_REASONING))
    strict = "{{ raise_exception('x') }}"
    env_render = jinja_render("{% if messages[0].role == 'assistant' %}{{ undefined_call() }}{% endif %}" + strict)
    assert "cannot render the probe" in incremental_problem(env_render)
    render = jinja_render(DROPS_OLD_REASONING)
    renderer = ChatRenderer(render)
    session = random_session(random.Random(3), 5)
    for messages in session:
        assert renderer.render(messages, []) == render(messages, [])
    assert renderer.incremental == 0


def test_verification_catches_what_the_probes_missed():
    render = jinja_render(SNEAKY)
    assert incremental_problem(render) is None
    renderer = ChatRenderer(render, verify_every=1)
    base = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u"}]
    assert renderer.render(base, []) == render(base, [])
    longer = base + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "MAGIC"}]
    assert renderer.render(longer, []) == render(longer, [])
    assert renderer.mismatches == 1 and renderer.problem
    later = longer + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "x"}]
    assert renderer.render(later, []) == render(later, []) and renderer.full == 2   # full renders from now on
