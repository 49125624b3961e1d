"""Incremental tokenization of a chat that is re-rendered to text on every turn.

Why it is exact: a HF `tokenizers.Tokenizer` first splits the text on its added tokens (Aho-Corasick,
leftmost-longest, on the raw text for tokens with normalized=False) and only then normalizes,
pre-tokenizes and encodes each piece between them, independently. So the ids of a text are the ids of
its prefix through any added token, followed by the ids of the rest encoded alone, as long as

- no added-token match can straddle the end of that token: every added token ends in a character that
  no added token has anywhere else, so a match running past the end would contain that character
  before its own end; and leftmost-longest picks the same matches in two texts that agree up to there;
- matching does not look past the token: no rstrip, lstrip or single_word, and normalized=False;
- special tokens are split off at all (encode_special_tokens is off), nothing truncates or pads;
- the normalizer and pre-tokenizer treat a piece the same wherever it sits. The known ones below do;
  Metaspace with prepend_scheme "first" does not (it prepends only at offset 0 of the whole text).

PrefixTokenizer checks these at construction and, when one fails, encodes every text in full.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

_POSITION_FREE = {
    "normalizer": {"Sequence", "NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Strip", "StripAccents", "Replace",
                   "Prepend", "Precompiled", "BertNormalizer"},
    "pre_tokenizer": {"Sequence", "ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit",
                      "CharDelimiterSplit", "UnicodeScripts", "BertPreTokenizer", "Metaspace"},
}


class PrefixTokenizer:
    """Encodes successive texts of one session, re-encoding only from the last added token they share.

    `encode(text)` equals `tokenizer.encode(text, add_special_tokens=False)`. Attributes for metrics:
    hits (encodes that reused ids), fallbacks (full encodes), reused_tokens (ids not re-encoded), and
    unsafe_reason (why every encode is a full one, or None).
    """

    def __init__(self, tokenizer: Any, *, incremental: bool = True) -> None:
        """tokenizer: a transformers fast tokenizer or a `tokenizers.Tokenizer`; incremental=False: always whole."""
        self._backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        added = self._backend.get_added_tokens_decoder()
        self._added_ids = frozenset(added)
        self.unsafe_reason: str | None = (unsafe_reason(self._backend, added.values()) if incremental
                                          else "off by request")
        self.hits = self.fallbacks = self.reused_tokens = 0
        self._text = ""
        self._ids = np.zeros(0, dtype=np.int32)
        self._buffer = np.zeros(0, dtype=np.int32)
        self._high_water = 0          # buffer positions below this may be in views handed out
        self._ends: list[int] = []    # char offset in _text just past each added token
        self._counts: list[int] = []  # len(_ids) up to and including that token

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_array(self, text: str) -> np.ndarray:
        """The ids as a read-only int32 array: a long history is copied once, in C, never as Python ints."""
        keep = -1 if self.unsafe_reason else self._last_shared_boundary(text)
        if keep < 0:
            self.fallbacks += 1
            start, kept, ends, counts = 0, 0, [], []
        else:
            self.hits += 1
            start, kept = self._ends[keep], self._counts[keep]
            self.reused_tokens += kept
            ends, counts = self._ends[:keep + 1], self._counts[:keep + 1]
        # encode_batch releases the GIL while it works (encode does not): the event loop goes on meanwhile.
        encoding = self._backend.encode_batch([text[start:]], add_special_tokens=False)[0]
        suffix = encoding.ids
        positions = [i for i, token in enumerate(suffix) if token in self._added_ids]
        if positions:
            offsets = encoding.offsets
            ends += [start + offsets[i][1] for i in positions]
            counts += [kept + i + 1 for i in positions]
        ids = self._extend(kept, suffix)
        self._text, self._ids, self._ends, self._counts = text, ids, ends, counts
        return ids

    def _extend(self, kept: int, suffix: list[int]) -> np.ndarray:
        """ids[:kept] + suffix as a read-only view of an append-only buffer.

        Views handed out earlier (a turn still on its way upstream) must never change, so the
        buffer is written in place only past its high-water mark or where the new ids equal what
        is there (the few ids re-encoded after the last added token); otherwise a new buffer.
        """
        n, hw = kept + len(suffix), self._high_water
        shared = min(n, hw) - kept
        in_place = n <= len(self._buffer) and (
            shared <= 0 or self._buffer[kept:kept + shared].tolist() == suffix[:shared])
        if not in_place:
            buffer = np.empty(max(n * 2, 1024), dtype=np.int32)
            buffer[:kept] = self._buffer[:kept]
            self._buffer, hw = buffer, kept
        self._buffer[kept:n] = suffix
        self._high_water = max(hw, n)
        view = self._buffer[:n]
        view.setflags(write=False)
        return view

    def _last_shared_boundary(self, text: str) -> int:
        """Index of the last boundary of the previous text up to which `text` equals it, or -1."""
        prev, ends = self._text, self._ends
        if text.startswith(prev):  # the usual turn: the chat only grew
            return len(ends) - 1
        # Shared prefixes are monotone in length, so bisect the boundaries; each test is one C-level compare.
        lo, hi = 0, len(ends)
        while lo < hi:
            mid = (lo + hi) // 2
            if text.startswith(prev[:ends[mid]]):
                lo = mid + 1
            else:
                hi = mid
        return lo - 1


def unsafe_reason(backend: Any, added_tokens: Iterable[Any]) -> str | None:
    """Why cutting at added tokens may not reproduce a full encode with this tokenizer; None when it does."""
    added_tokens = list(added_tokens)
    for token in added_tokens:
        if not token.content:
            return "an added token is empty"
        flags = [name for name in ("normalized", "lstrip", "rstrip", "single_word") if getattr(token, name)]
        if flags:
            return f"added token {token.content!r} has {', '.join(flags)}"
    last_chars = {token.content[-1] for token in added_tokens}
    for token in added_tokens:
        inner = last_chars.intersection(token.content[:-1])
        if inner:
            return f"added token {token.content!r} holds {inner.pop()!r}, which ends an added token"
    if backend.encode_special_tokens:
        return "encode_special_tokens is set, so special tokens are not split off"
    if backend.truncation is not None or backend.padding is not None:
        return "the tokenizer truncates or pads"
    for kind, known in _POSITION_FREE.items():
        component = getattr(backend, kind)
        if component is None:
            continue
        for state in _components(json.loads(component.__getstate__())):
            if state.get("type") not in known:
                return f"unvetted {kind} {state.get('type')!r}"
            if state.get("type") == "Metaspace" and state.get("prepend_scheme") == "first":
                return "Metaspace prepends only at the start of the whole text"
    return None


def _components(state: dict) -> Iterator[dict]:
    yield state
    for child in state.get("normalizers") or state.get("pretokenizers") or ():
        yield from _components(child)
