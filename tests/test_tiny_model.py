"""The tiny offline model: tokenizer reload fidelity, weights, atomic builds, and the chat template contract."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from tokenizers import Tokenizer

from agentrl.models import tiny
from agentrl.models.tiny import assistant_text, render_chat

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]

TEXTS = [
    "",
    "hello world",
    "Grüße, naïve café: 日本語のテキスト, Ελληνικά, русский, emoji 🙂👍🏽, math ∑∫√",
    "combining: e\u0301 vs \u00e9, A\u030a, \u1e9b\u0323 (NFC composes the first ones)",
    "def f(x: int) -> int:\n\treturn x ** 2  # square\n\n\n    \n  \t \r\n",
    "runs    of     spaces\n\n\n\nand newlines\r\n\r\n and trailing   ",
    "numbers 1234567890 3.14159 0xDEADbeef 1e-9",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nok<|im_end|>",
    "<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>",
    "<tool_response>\nout\n</tool_response><|endoftext|>",
    "glued<|im_end|>text<think>x</think>y and half tokens <|im_ and im_end|> and <think",
    "don't can't we'll I'M YOU'RE 'quoted' \"double\"",
    "\x00\x01\x7f control chars \u200b zero width \ufeff bom \U0001F600",
]


def test_reload_tokenizes_exactly_like_the_trained_tokenizer(tiny_model):
    from transformers import AutoTokenizer, Qwen2Tokenizer

    trained = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    reloaded = AutoTokenizer.from_pretrained(tiny_model)
    # The trap: Qwen2Tokenizer rebuilds the normalizer and pre-tokenizer instead of reading tokenizer.json.
    assert isinstance(reloaded, Qwen2Tokenizer)
    for text in TEXTS:
        expected = trained.encode(text, add_special_tokens=False).ids
        assert reloaded.encode(text, add_special_tokens=False) == expected, text
        assert reloaded(text)["input_ids"] == expected, text  # and no BOS/EOS is added by default
        assert reloaded.decode(expected) == trained.decode(expected, skip_special_tokens=False)


def test_added_tokens(tiny_model):
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    assert len(tok) == AutoConfig.from_pretrained(tiny_model).vocab_size == 4000
    for token in tiny.SPECIAL_TOKENS + tiny.MARKUP_TOKENS:
        assert tok.encode(token, add_special_tokens=False) == [tok.convert_tokens_to_ids(token)]
    ids = tok.encode("<think>\nr\n</think>\n\n<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    # Markup tokens are not special: a serving engine's skip_special_tokens decode keeps them.
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nr\n</think>\n\n<tool_call>x</tool_call>"


def test_model_reloads_offline_with_tied_embeddings(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert model.config.max_position_embeddings == 131072
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert 200_000 < sum(p.numel() for p in model.parameters()) < 2_000_000
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 4000) and torch.isfinite(logits).all()


def test_tokenizer_files_are_deterministic(tiny_model, tmp_path):
    tiny.make_tokenizer(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / name).read_bytes() == (tiny_model / name).read_bytes(), name


def test_weights_follow_the_seed_and_spare_the_callers_generator(tiny_model, tmp_path):
    import torch

    for seed in (0, 1):
        (tmp_path / str(seed)).mkdir()
        shutil.copy(tiny_model / "tokenizer.json", tmp_path / str(seed))
        torch.manual_seed(123)
        tiny.make_model(tmp_path / str(seed), seed=seed)
        assert torch.rand(1).item() == torch.rand(1, generator=torch.Generator().manual_seed(123)).item()
    weights = [(d / "model.safetensors").read_bytes() for d in (tiny_model, tmp_path / "0", tmp_path / "1")]
    assert weights[0] == weights[1] != weights[2]


def _fake_builders(monkeypatch):
    def make_tokenizer(out_dir, *, vocab_size):
        (out_dir / "tokenizer.json").write_text(str(vocab_size))

    def make_model(out_dir, *, seed, hidden_size, layers):
        (out_dir / "model.safetensors").write_text(f"{seed} {hidden_size} {layers}")

    monkeypatch.setattr(tiny, "make_tokenizer", make_tokenizer)
    monkeypatch.setattr(tiny, "make_model", make_model)


def test_a_shape_other_than_the_default_is_a_different_model(tmp_path, monkeypatch):
    _fake_builders(monkeypatch)
    default = tiny.make_tiny_model(tmp_path / "a", seed=1)
    assert "hidden_size" not in json.loads((default / tiny.MARKER).read_text())   # older caches still match
    wide = tiny.make_tiny_model(tmp_path / "b", seed=1, hidden_size=128, layers=4)
    assert json.loads((wide / tiny.MARKER).read_text())["hidden_size"] == 128
    assert (wide / "model.safetensors").read_text() == "1 128 4"
    with pytest.raises(ValueError, match="holds a tiny model"):
        tiny.make_tiny_model(tmp_path / "b", seed=1)
    with pytest.raises(ValueError, match="multiple of 32"):
        tiny.make_tiny_model(tmp_path / "c", hidden_size=100)


def test_build_is_idempotent_and_leaves_no_staging(tmp_path, monkeypatch):
    _fake_builders(monkeypatch)
    out = tmp_path / "models" / "tiny"
    assert tiny.make_tiny_model(out, seed=3) == out
    marker = json.loads((out / tiny.MARKER).read_text())
    assert marker["seed"] == 3 and marker["weights"] is True
    (out / "model.safetensors").write_text("untouched")
    tiny.make_tiny_model(out, seed=3)
    assert (out / "model.safetensors").read_text() == "untouched"
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]


def test_build_fills_an_empty_directory(tmp_path, monkeypatch):
    _fake_builders(monkeypatch)
    tiny.make_tiny_model(tmp_path, weights=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [tiny.MARKER, "tokenizer.json"]


def test_build_refuses_foreign_or_different_directories(tmp_path, monkeypatch):
    _fake_builders(monkeypatch)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a tiny model"):
        tiny.make_tiny_model(tmp_path / "other")
    assert [p.name for p in (tmp_path / "other").iterdir()] == ["notes.txt"]
    tiny.make_tiny_model(tmp_path / "tiny", seed=1)
    with pytest.raises(ValueError, match="'seed': 1"):
        tiny.make_tiny_model(tmp_path / "tiny", seed=2)


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    _fake_builders(monkeypatch)

    def broken(out_dir, **_):
        raise RuntimeError("out of disk")

    monkeypatch.setattr(tiny, "make_model", broken)
    with pytest.raises(RuntimeError):
        tiny.make_tiny_model(tmp_path / "tiny")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_cli_builds_a_tokenizer_and_reports_errors(tmp_path):
    script = str(ROOT / "tools" / "make_tiny_model.py")
    out = tmp_path / "tok"
    r = subprocess.run([sys.executable, script, str(out), "--vocab-size", "300", "--no-weights"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    assert Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size() == 300
    assert not (out / "model.safetensors").exists()

    r = subprocess.run([sys.executable, script, str(tmp_path / "small"), "--vocab-size", "100"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "vocab_size must be at least 265" in r.stderr
    r = subprocess.run([sys.executable, script, str(out), "--vocab-size", "300"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "'weights': False" in r.stderr


# The chat template contract.

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                           "parameters": {"type": "object",
                                                          "properties": {"command": {"type": "string"}}}}}]


def call(name: str, **arguments) -> dict:
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_template_renders_the_documented_text():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Fix it."},
        {"role": "assistant", "content": "Looking.", "reasoning_content": "Where?",
         "tool_calls": [call("bash", command="ls\n-a"), call("edit", line=3, ok=True, spec={"a": ["é"]})]},
        {"role": "tool", "tool_call_id": "call_bash", "content": "x.py"},
        {"role": "tool", "tool_call_id": "call_edit", "content": "done"},
        {"role": "assistant", "content": "Fixed."},
    ]
    text = render_chat(messages, tools=TOOLS, add_generation_prompt=True)
    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert f"<tools>\n{json.dumps(TOOLS[0])}\n</tools>" in system
    assert rest == (
        "<|im_start|>user\nFix it.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nWhere?\n</think>\n\nLooking.\n"
        "<tool_call>\n<function=bash>\n<parameter=command>\nls\n-a\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=edit>\n<parameter=line>\n3\n</parameter>\n<parameter=ok>\ntrue\n</parameter>\n"
        '<parameter=spec>\n{"a": ["é"]}\n</parameter>\n</function>\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nx.py\n</tool_response>\n<tool_response>\ndone\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nFixed.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_system_turn_appears_for_tools_alone():
    user = [{"role": "user", "content": "hi"}]
    assert render_chat(user) == "<|im_start|>user\nhi<|im_end|>\n"
    assert render_chat(user, tools=TOOLS).startswith("<|im_start|>system\n# Tools\n")
    assert render_chat([{"role": "system", "content": "S"}] + user) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")


def test_reasoning_is_kept_in_every_assistant_turn():
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "1", "reasoning_content": "r1"},
             {"role": "user", "content": "b"}, {"role": "assistant", "content": "2", "reasoning_content": "r2"},
             {"role": "user", "content": "c"}]
    text = render_chat(turns, add_generation_prompt=True)
    assert "<think>\nr1\n</think>\n\n1<|im_end|>" in text and "<think>\nr2\n</think>\n\n2<|im_end|>" in text


def test_json_string_arguments_are_refused():
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}
    with pytest.raises(jinja2.TemplateError, match="must be a dict"):
        render_chat([{"role": "user", "content": "x"}, message])


ASSISTANT_MESSAGES = [
    {"role": "assistant", "content": "Just text."},
    {"role": "assistant", "content": "", "reasoning_content": "Only thinking,\nacross lines."},
    {"role": "assistant", "content": None, "tool_calls": [call("bash", command="ls")]},
    {"role": "assistant", "content": "Two calls:", "reasoning_content": "plan",
     "tool_calls": [call("bash", command="cat <<EOF\nmulti\n  line\nEOF\n"), call("bash", command="")]},
    {"role": "assistant", "content": "", "tool_calls": [
        call("edit", n=0, x=1.5, flag=False, none=None, items=[1, "two"], nested={"k": {"é": "<|im_end|>"}})]},
    {"role": "assistant", "content": "  spaced \n", "reasoning_content": "",
     "tool_calls": [call("f"), call("g", s="  ")]},
]
HISTORIES = [
    [{"role": "user", "content": "go"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "go"}],
    [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [call("bash", command="x")]},
     {"role": "tool", "tool_call_id": "call_bash", "content": "out"}],
]


@pytest.mark.parametrize("message", ASSISTANT_MESSAGES)
@pytest.mark.parametrize("history", HISTORIES)
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_rendered_history_continues_what_the_model_generated(message, history, tools):
    generated = assistant_text(message) + "<|im_end|>"
    prompt = render_chat(history, tools=tools, add_generation_prompt=True)
    nxt = {"role": "user", "content": "next"}
    later = render_chat(history + [message, nxt], tools=tools, add_generation_prompt=True)
    assert later == prompt + generated + "\n" + render_chat([nxt], add_generation_prompt=True)


def test_apply_chat_template_matches_render_chat(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    for message in ASSISTANT_MESSAGES:
        messages = HISTORIES[2] + [message]
        text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
        assert text == render_chat(messages, tools=TOOLS)
        # transformers 5 returns a BatchEncoding, not a list, when tokenizing
        ids = tok.apply_chat_template(messages, tools=TOOLS, tokenize=True)["input_ids"]
        assert ids == tok.encode(text, add_special_tokens=False)
    generated = tok.encode(assistant_text(ASSISTANT_MESSAGES[3]) + "<|im_end|>", add_special_tokens=False)
    assert generated[-1] == tok.eos_token_id and tok.convert_tokens_to_ids("<tool_call>") in generated
