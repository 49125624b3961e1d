"""PrefixTokenizer: incremental encodes equal full encodes, on the tiny model's real tokenizer."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, pre_tokenizers

from agentrl.adapter.tokens import PrefixTokenizer
from agentrl.models import tiny

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ADDED = tiny.SPECIAL_TOKENS + tiny.MARKUP_TOKENS
PIECES = [
    "plain words ", "Grüße naïve ", "日本語 ", "🙂👍🏽", "e\u0301", "\u0301", "A\u030a", "\t", "    ", "\n\n\n", "\r\n",
    "def f(x):\n    return x ** 2\n", "{\"k\": [1, 2.5, null]}", "don't ", "1234567", "<|im_", "end|>", "<thi", "nk>",
    "<", "|", ">", *ADDED,
]


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def full(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(n))


def random_message(rng: random.Random, turn: int) -> dict:
    kind = rng.choice(["user", "assistant", "assistant", "tool"])
    if kind == "assistant":
        calls = [{"id": f"c{turn}.{i}", "type": "function",
                  "function": {"name": "bash", "arguments": {"command": random_text(rng, 4), "n": i}}}
                 for i in range(rng.randrange(3))]
        return {"role": "assistant", "content": random_text(rng, rng.randrange(6)), "tool_calls": calls,
                "reasoning_content": random_text(rng, rng.randrange(8))}
    return {"role": kind, "content": random_text(rng, rng.randrange(1, 30))}


def test_the_tiny_tokenizer_is_vouched_for(tok):
    assert PrefixTokenizer(tok).unsafe_reason is None


# No lone surrogates (category Cs): they are not text, and the tokenizer refuses them with a TypeError.
TEXTS = st.lists(st.sampled_from(PIECES) | st.characters(exclude_categories=("Cs",)), max_size=12).map("".join)


@settings(max_examples=300, deadline=None)
@given(before=TEXTS, token=st.sampled_from(ADDED), after=TEXTS)
def test_text_after_an_added_token_encodes_on_its_own(tok, before, token, after):
    # The premise of PrefixTokenizer, checked on this tokenizer against full encodes.
    assert full(tok, before + token + after) == full(tok, before + token) + full(tok, after)


def test_a_long_chat_encodes_like_a_full_encode_at_every_turn(tok):
    rng = random.Random(7)
    incremental = PrefixTokenizer(tok)
    messages = [{"role": "system", "content": "You fix bugs. <|im_end|> is just text here."}]
    tools = [{"type": "function", "function": {"name": "bash", "description": "Run <cmd> é",
                                               "parameters": {"type": "object"}}}]
    for turn in range(240):
        messages.append(random_message(rng, turn))
        text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        assert incremental.encode(text) == full(tok, text), turn
    assert incremental.fallbacks == 1 and incremental.hits == 239
    assert incremental.reused_tokens > 50 * len(full(tok, text))


def test_growing_raw_text_cut_anywhere(tok):
    # Texts cut inside added tokens and between combining characters, as a streamed completion would be.
    rng = random.Random(3)
    text = random_text(rng, 3000)
    incremental = PrefixTokenizer(tok)
    for end in sorted(rng.sample(range(len(text)), 150)) + [len(text)]:
        assert incremental.encode(text[:end]) == full(tok, text[:end]), end
    assert incremental.hits > 140


def test_rewritten_history_cuts_earlier_or_starts_over(tok):
    rng = random.Random(11)
    messages = [{"role": "system", "content": "S"}] + [random_message(rng, t) for t in range(120)]
    incremental = PrefixTokenizer(tok)
    text = tok.apply_chat_template(messages, tokenize=False)
    assert incremental.encode(text) == full(tok, text)
    for index in (100, 60, 1, 119, 60):
        messages[index] = {"role": "user", "content": random_text(rng, 10)}
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=index % 2 == 0)
        reused = incremental.reused_tokens
        assert incremental.encode(text) == full(tok, text), index
        assert incremental.reused_tokens > reused  # the prefix before the rewrite is kept
    assert (incremental.hits, incremental.fallbacks) == (5, 1)
    for other in ("", "no added tokens at all", "<|im_start|>system\nT<|im_end|>\n" + text):
        assert incremental.encode(other) == full(tok, other)
    assert incremental.fallbacks == 4  # nothing shared; then, twice, no added token in the previous text


def test_accepts_a_tokenizers_tokenizer(tiny_model, tok):
    backend = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    incremental = PrefixTokenizer(backend)
    text = "<|im_start|>user\nhi<|im_end|>\n"
    for more in ("", "<think>x", "<think>xy"):
        assert incremental.encode(text + more) == full(tok, text + more)
    assert (incremental.fallbacks, incremental.hits) == (1, 2)


def variant(tiny_model, change) -> Tokenizer:
    backend = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    change(backend)
    return backend


@pytest.mark.parametrize(("change", "reason"), [
    (lambda b: b.add_tokens([AddedToken("<x>", rstrip=True, normalized=False)]), "rstrip"),
    (lambda b: b.add_tokens([AddedToken("<y>", normalized=True)]), "normalized"),
    (lambda b: b.add_tokens([AddedToken("a>b", normalized=False)]), "ends an added token"),
    (lambda b: setattr(b, "encode_special_tokens", True), "encode_special_tokens"),
    (lambda b: b.enable_truncation(10), "truncates"),
    (lambda b: setattr(b, "pre_tokenizer", pre_tokenizers.Metaspace(prepend_scheme="first")), "Metaspace"),
    (lambda b: setattr(b, "pre_tokenizer", pre_tokenizers.FixedLength(4)), "unvetted pre_tokenizer"),
])
def test_unsafe_tokenizers_always_encode_in_full(tiny_model, change, reason):
    backend = variant(tiny_model, change)
    incremental = PrefixTokenizer(backend)
    assert reason in incremental.unsafe_reason
    texts = ["<|im_start|>u<x>", "<|im_start|>u<x>  v a>b <y>", "<|im_start|>u<x>  v a>b <y> w"]
    for text in texts:
        assert incremental.encode(text) == backend.encode(text, add_special_tokens=False).ids
    assert (incremental.hits, incremental.fallbacks) == (0, 3)


def test_the_rstrip_check_is_not_vacuous(tiny_model):
    backend = variant(tiny_model, lambda b: b.add_tokens([AddedToken("<x>", rstrip=True, normalized=False)]))

    def ids(text):
        return backend.encode(text, add_special_tokens=False).ids

    # Cutting after "<x>" would be wrong: rstrip makes the token swallow the spaces that follow it.
    assert ids("a<x>  b") != ids("a<x>") + ids("  b")


def test_at_96k_tokens(tok):
    # Measured on the 2-core dev box, 99k tokens (336k chars, ~2000 messages): a full encode takes 150-180 ms,
    # the incremental encode of the next turn 1.6-2.4 ms, mostly copying the id lists. Rendering the chat
    # template for that history takes ~55 ms itself: O(history) too, though a third of the full encode.
    rng = random.Random(5)
    messages, text = [{"role": "system", "content": "S"}], ""
    while len(full(tok, text)) < 96_000:
        messages += [random_message(rng, len(messages)) for _ in range(100)]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    incremental = PrefixTokenizer(tok)
    start = time.perf_counter()
    assert incremental.encode(text) == full(tok, text)
    full_seconds = time.perf_counter() - start
    messages.append(random_message(rng, len(messages)))
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    start = time.perf_counter()
    ids = incremental.encode(text)
    incremental_seconds = time.perf_counter() - start
    assert ids == full(tok, text) and incremental.hits == 1
    print(f"{len(ids)} tokens: full {full_seconds * 1e3:.1f} ms, incremental {incremental_seconds * 1e3:.2f} ms")


def test_ids_handed_out_never_change_while_later_chats_reuse_the_buffer(tok):
    """A turn's ids may still be on their way upstream when the next chat of its session is encoded."""
    pt = PrefixTokenizer(tok)
    base = "<|im_start|>user\nfix it<|im_end|>\n<|im_start|>assistant\n"
    texts = [base, base + "ok<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n",
             base + "ok<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>user\nx<|im_end|>\n",
             "<|im_start|>system\nother<|im_end|>\n" + base,       # diverges at the start
             "<|im_start|>system\nother<|im_end|>\n" + base + "y"]
    handed = []
    for text in texts:
        ids = pt.encode_array(text)
        assert not ids.flags.writeable and ids.tolist() == tok.encode(text, add_special_tokens=False)
        handed.append((ids, ids.tolist()))
        for view, values in handed:
            assert view.tolist() == values
    assert pt.hits >= 3
