"""A tiny Qwen2-shaped model built offline: a byte-level BPE tokenizer, the chat template, random weights.

Nothing is downloaded. The tokenizer is trained on the Python standard library's own sources, so the
same interpreter, tokenizers and transformers versions give the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sysconfig
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Added but not special, as in Qwen3: each is one id, yet decode(skip_special_tokens=True) keeps it,
# so reasoning and tool calls survive the way serving engines decode completions.
MARKUP_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
EOS_TOKEN, PAD_TOKEN = "<|im_end|>", "<|endoftext|>"
BYTE_ALPHABET = 256
MAX_POSITIONS = 131072
CORPUS_BYTES = 4_000_000
MARKER = "agentrl_tiny.json"
CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")

_SYNTHETIC = (
    "system\nYou are a coding agent. Inspect the repository with the tools and fix the failing tests.\n",
    "user\nThe suite fails with `AssertionError: 3 != 4` in tests/test_math.py::test_add. Please fix it.\n",
    "assistant\nLet me run the failing test first.\n<function=bash>\n<parameter=command>\n"
    "pytest -x -q tests/test_math.py\n</parameter>\n</function>\n",
    "assistant\n<function=str_replace>\n<parameter=path>\nsrc/math.py\n</parameter>\n<parameter=old>\n"
    "    return a - b\n</parameter>\n<parameter=new>\n    return a + b\n</parameter>\n</function>\n",
    "user\n1 passed in 0.02s\nexit code: 0\n",
    '{"type": "function", "function": {"name": "bash", "description": "Run a shell command", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}',
    "Grüße, naïve café — 日本語のテキスト, Ελληνικά, русский текст, emoji 🙂 and tabs\tand  runs   of spaces.\n",
)


def training_corpus(max_bytes: int = CORPUS_BYTES) -> list[str]:
    """Whole top-level stdlib modules in name order until max_bytes, then synthetic chat strings.

    The chat strings are repeated so that their markup earns merges of its own.
    """
    # Top level only: a recursive walk of the stdlib directory would wander into site-packages.
    texts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        if size >= max_bytes:
            break
        data = path.read_bytes()
        texts.append(data.decode("utf-8", errors="replace"))
        size += len(data)
    return texts + [text for text in _SYNTHETIC for _ in range(50)]


def train_tokenizer(vocab_size: int = 4000):
    """A trained `tokenizers.Tokenizer` with the added tokens; vocab_size counts them (at most, on tiny corpora)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    added = len(SPECIAL_TOKENS) + len(MARKUP_TOKENS)
    if vocab_size < BYTE_ALPHABET + added:
        raise ValueError(f"vocab_size must be at least {BYTE_ALPHABET + added} (256 bytes + {added} added tokens), "
                         f"got {vocab_size}")
    tokenizer = Tokenizer(BPE())
    # Exactly what Qwen2Tokenizer rebuilds on load, whatever tokenizer.json says: trained with anything
    # else, the merges would not fit the pieces AutoTokenizer feeds them and encodings would silently change.
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=vocab_size - added, min_frequency=2, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(training_corpus(), trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tokenizer


def make_tokenizer(out_dir: Path, *, vocab_size: int = 4000) -> None:
    """Write a Qwen2Tokenizer directory (tokenizer.json, tokenizer_config.json, chat_template.jinja)."""
    from transformers import Qwen2Tokenizer

    # transformers annotates unk_token `str`; None (no unknown token: byte-level BPE needs none) is what it takes
    tokenizer = Qwen2Tokenizer(tokenizer_object=train_tokenizer(vocab_size), eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                               unk_token=None, bos_token=None,  # type: ignore[arg-type]
                               model_max_length=MAX_POSITIONS)
    tokenizer.chat_template = chat_template()
    tokenizer.save_pretrained(str(out_dir))


DEFAULT_SHAPE = {"hidden_size": 64, "layers": 2}


def make_model(out_dir: Path, *, seed: int = 0, hidden_size: int = 64, layers: int = 2, experts: int = 0,
               experts_per_token: int = 2) -> None:
    """Write random weights and config.json beside the tokenizer that out_dir already holds: Qwen2, or with
    `experts` Qwen3-MoE (every layer's MLP a mixture of that many experts, each as wide as the model, of
    which each token takes `experts_per_token`).

    Heads are 16 wide, two query heads share a key-value head, and the dense MLP is twice the width."""
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = Tokenizer.from_file(str(Path(out_dir) / "tokenizer.json"))
    common: dict[str, Any] = dict(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=layers,
        num_attention_heads=hidden_size // 16, num_key_value_heads=max(1, hidden_size // 32),
        max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.token_to_id(EOS_TOKEN), pad_token_id=tokenizer.token_to_id(PAD_TOKEN),
    )
    if experts:       # written out: SGLang reads it from config.json (this transformers derives it)
        common["head_dim"] = 16
    with torch.random.fork_rng(devices=[]):  # seed the weights without reseeding the caller's generator
        torch.manual_seed(seed)
        if experts:
            model: Any = Qwen3MoeForCausalLM(Qwen3MoeConfig(
                **common, num_experts=experts, num_experts_per_tok=experts_per_token,
                moe_intermediate_size=hidden_size, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]))
        else:
            model = Qwen2ForCausalLM(Qwen2Config(**common))
    model.save_pretrained(str(out_dir), safe_serialization=True)


def make_tiny_model(out_dir: Path, *, vocab_size: int = 4000, seed: int = 0, weights: bool = True,
                    hidden_size: int = 64, layers: int = 2, experts: int = 0, experts_per_token: int = 2) -> Path:
    """Build the tiny model into out_dir atomically; a no-op when out_dir already holds the same one.
    `experts` > 0: the mixture-of-experts variant (make_model)."""
    out_dir = Path(out_dir)
    if hidden_size < 16 or hidden_size % 32 or layers < 1:
        raise ValueError(f"hidden_size must be a multiple of 32 and layers at least 1, got {hidden_size} and {layers}")
    if experts and not 1 <= experts_per_token < experts:
        raise ValueError(f"experts_per_token must be at least 1 and below experts ({experts}), got {experts_per_token}")
    shape: dict[str, int] = {"hidden_size": hidden_size, "layers": layers}
    if experts:
        shape.update(experts=experts, experts_per_token=experts_per_token)
    # The default shape stays out of the marker, so models built before the shape was an option still match.
    params = _params(vocab_size=vocab_size, seed=seed, weights=weights,
                     **({} if shape == DEFAULT_SHAPE else shape))
    if _holds(out_dir, params):
        return out_dir
    if out_dir.exists() and not _is_empty_dir(out_dir):
        found = _marker(out_dir)
        what = f"a tiny model built with {found}" if found else "files that are not a tiny model"
        raise ValueError(f"{out_dir} holds {what}; wanted {params}. Remove it or choose another directory.")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        make_tokenizer(staging, vocab_size=vocab_size)
        if weights:
            make_model(staging, seed=seed, **shape)
        (staging / MARKER).write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the model from the other users of a shared filesystem
        try:
            staging.replace(out_dir)  # atomic, and replaces nothing but an empty directory
        except OSError:
            if not _holds(out_dir, params):  # unless a concurrent build of the same model won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _params(**params: Any) -> dict[str, Any]:
    # The template's digest makes an edited template a different model rather than a stale cache hit.
    return {**params, "chat_template_sha256": hashlib.sha256(chat_template().encode()).hexdigest()}


def _marker(out_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _holds(out_dir: Path, params: dict[str, Any]) -> bool:
    return _marker(out_dir) == params


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and next(path.iterdir(), None) is None


@cache
def chat_template() -> str:
    return CHAT_TEMPLATE_PATH.read_text()


def render_chat(messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt: bool = False) -> str:
    """The chat as text, rendered by transformers exactly as `apply_chat_template(..., tokenize=False)` would."""
    from transformers.utils.chat_template_utils import render_jinja_template

    # transformers annotates the result `str`; it is (rendered conversations, generation indices). Its `tools`
    # is an invariant list[dict | Callable], which a list[dict] is not.
    rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
        conversations=[messages], tools=tools,  # type: ignore[arg-type]
        chat_template=chat_template(), add_generation_prompt=add_generation_prompt)
    return rendered[0]


def assistant_text(message: dict) -> str:
    """What a model emits for this assistant message, up to but excluding its `<|im_end|>`."""
    prompt = render_chat([{"role": "user", "content": ""}], add_generation_prompt=True)
    chat = render_chat([{"role": "user", "content": ""}, message])
    end = EOS_TOKEN + "\n"
    if not (chat.startswith(prompt) and chat.endswith(end)):
        raise ValueError(f"not an assistant message: {message!r}")
    return chat[len(prompt):-len(end)]
