"""Token ids as text, with the run's tokenizer when it loads; as ids when it does not."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("agentrl.view")
NO_TOKENIZER = "no tokenizer: run.yaml names no train.model directory here (give --tokenizer DIR)"


class Decoder:
    """decode(ids) -> text and piece(id) -> one token's text (cached); `tokenizer` None: ids as text."""

    def __init__(self, tokenizer: Any = None, source: str = ""):
        self.tokenizer, self.source = tokenizer, source
        self._pieces: dict[int, str] = {}

    @property
    def decodes(self) -> bool:
        return self.tokenizer is not None

    def decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def piece(self, token_id: int) -> str:
        found = self._pieces.get(token_id)
        if found is None:
            found = self._pieces[token_id] = (self.decode([token_id]) if self.tokenizer is not None
                                              else f"{token_id} ")
        return found


def load_decoder(path: Path | None) -> tuple[Decoder, str | None]:
    """The decoder of the tokenizer in `path`, or one of ids and the reason it is (for the pages to say)."""
    if path is None:
        return Decoder(), NO_TOKENIZER
    try:
        from transformers import AutoTokenizer

        return Decoder(AutoTokenizer.from_pretrained(str(path)), str(path)), None
    except Exception as e:   # noqa: BLE001 - any failure to load leaves the ids, said on the pages
        log.warning("the tokenizer in %s did not load (%s): tokens are shown as ids", path, e)
        return Decoder(), f"the tokenizer in {path} did not load ({type(e).__name__}: {e}): tokens are shown as ids"
