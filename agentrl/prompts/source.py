"""Prompt groups for each rollout, in a per-epoch shuffled order that a resumed run reproduces exactly.

Rollout r takes the absolute group indices [r*B, (r+1)*B). Absolute index g lies in epoch g // N
(N rows) at position g % N of that epoch's permutation, and the permutation is a pure function of
(seed, epoch). Nothing is carried from one rollout to the next, so a fresh `PromptSource` asked for
rollout r returns what the long-lived one returned, and a checkpoint needs only the parameters
(`state()`). A batch may straddle an epoch boundary, and B > N is allowed: the batch then wraps
through whole epochs and holds some rows more than once (each from a different epoch).

The permutation orders the row indices by a keyed BLAKE2b hash of (seed, epoch, index), not by
numpy's Generator: NumPy does not promise a Generator's streams stay the same across versions
(NEP 19), and a resume after an upgrade must not silently reorder the data.

Prompts reach the agent as plain text. `load_prompt_rows` refuses a prompt that is not a string
(chat messages, say) and leaves the string exactly as written: no chat template is applied here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

ORDER = "blake2b-v1"   # names the permutation function; a state written with another is refused
STATE_VERSION = 1


class PromptDataError(ValueError):
    """The prompt data is malformed; the message names the file and line."""


class PromptStateError(ValueError):
    """A checkpointed prompt-source state does not fit these rows or this code."""


def rows_fingerprint(rows: Sequence[Mapping[str, Any]]) -> str:
    """sha256 of the rows' canonical JSON, in order: the same rows in another order differ."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def epoch_permutation(num_rows: int, seed: int, epoch: int) -> tuple[int, ...]:
    """The row indices in epoch `epoch`'s order: a pure function of (num_rows, seed, epoch)."""
    return _permutation(num_rows, seed, epoch)


@lru_cache(maxsize=8)   # a batch touches at most a few epochs; resorting N keys per group would not do
def _permutation(num_rows: int, seed: int, epoch: int) -> tuple[int, ...]:
    # The key is itself a digest: blake2b keys stop at 64 bytes, and a truncated one could merge two seeds.
    keyed = hashlib.blake2b(key=hashlib.blake2b(f"{ORDER}:{seed}:{epoch}".encode()).digest(), digest_size=16)

    def rank(i: int) -> bytes:
        h = keyed.copy()
        h.update(i.to_bytes(8, "little"))
        return h.digest()
    return tuple(sorted(range(num_rows), key=rank))


class PromptSource:
    """`PromptSource(rows, rollout_batch_size=B).groups_for_rollout(r)`: the prompt rows of rollout r.

    With shuffle=False every epoch is the rows in file order. Returns the row objects themselves.
    """

    def __init__(self, rows: Sequence[Mapping[str, Any]], *, rollout_batch_size: int, shuffle: bool = True,
                 seed: int = 0):
        if not rows:
            raise ValueError("no prompt rows: the prompt data is empty")
        if isinstance(rollout_batch_size, bool) or not isinstance(rollout_batch_size, int) or rollout_batch_size < 1:
            raise ValueError(f"rollout_batch_size must be an int >= 1, got {rollout_batch_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.rows = tuple(rows)
        self.rollout_batch_size = rollout_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self._fingerprint: str | None = None

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = rows_fingerprint(self.rows)
        return self._fingerprint

    def row_index(self, g: int) -> int:
        """The row at absolute group index g."""
        epoch, position = divmod(g, self.num_rows)
        if not self.shuffle:
            return position
        return epoch_permutation(self.num_rows, self.seed, epoch)[position]

    def group_indices(self, rollout: int) -> range:
        """The absolute group indices of rollout r: [r*B, (r+1)*B)."""
        _check_rollout(rollout)
        start = rollout * self.rollout_batch_size
        return range(start, start + self.rollout_batch_size)

    def groups_for_rollout(self, rollout: int) -> list[Mapping[str, Any]]:
        return [self.rows[self.row_index(g)] for g in self.group_indices(rollout)]

    def epoch_of(self, rollout: int) -> int:
        """The epoch of rollout r's first group (its last may lie in a later epoch)."""
        return self.group_indices(rollout).start // self.num_rows

    def state(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "order": ORDER, "seed": self.seed, "shuffle": self.shuffle,
                "num_rows": self.num_rows, "rollout_batch_size": self.rollout_batch_size,
                "rows_sha256": self.fingerprint}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> PromptSource:
        """The source a checkpoint described, over `rows`; refuses rows or code that would reorder the prompts."""
        if state.get("version") != STATE_VERSION or state.get("order") != ORDER:
            raise PromptStateError(f"prompt-source state version {state.get('version')!r} order {state.get('order')!r}"
                                   f" was written by other code (this reads version {STATE_VERSION} order {ORDER})")
        try:
            source = cls(rows, rollout_batch_size=state["rollout_batch_size"], shuffle=state["shuffle"],
                         seed=state["seed"])
            num_rows, fingerprint = state["num_rows"], state["rows_sha256"]
        except KeyError as e:
            raise PromptStateError(f"prompt-source state lacks {e.args[0]!r}") from None
        if source.num_rows != num_rows or source.fingerprint != fingerprint:
            raise PromptStateError(
                f"the prompt data differs from the checkpoint's ({source.num_rows} rows, sha256 "
                f"{source.fingerprint[:12]}... vs {num_rows} rows, {str(fingerprint)[:12]}...): resuming would "
                "train on other prompts in another order; point the run at the data it started with")
        return source


def _check_rollout(rollout: int) -> None:
    if isinstance(rollout, bool) or not isinstance(rollout, int) or rollout < 0:
        raise ValueError(f"rollout must be an int >= 0, got {rollout!r}")


def load_prompt_rows(path: Path | str) -> list[dict[str, Any]]:
    """The rows of a prompt JSONL file (`agentrl convert harbor`): one object per line, blank lines skipped.

    Each row needs "prompt" as a non-empty string, kept exactly as written, and "metadata", if
    present, as an object. Errors name the file and the 1-based line.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad_line = data.count(b"\n", 0, e.start) + 1
        raise PromptDataError(f"{path}:{bad_line}: not UTF-8 (byte {e.start} of the file)") from None
    rows = []
    # split("\n"), not splitlines(): U+2028 and friends are valid inside a JSON string, not line ends.
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            rows.append(parse_prompt_row(line, where=f"{path}:{number}"))
    if not rows:
        raise PromptDataError(f"{path}: no prompt rows")
    return rows


def parse_prompt_row(line: str, *, where: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptDataError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise PromptDataError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    if "prompt" not in row:
        raise PromptDataError(f"{where}: no \"prompt\"")
    prompt = row["prompt"]
    if not isinstance(prompt, str):
        raise PromptDataError(f"{where}: \"prompt\" must be plain text (a string), got {type(prompt).__name__}; "
                              "prompts reach the agent as text and are never chat-templated here")
    if not prompt.strip():
        raise PromptDataError(f"{where}: \"prompt\" is empty")
    if "metadata" in row and not isinstance(row["metadata"], dict):
        raise PromptDataError(f"{where}: \"metadata\" must be an object, got {type(row['metadata']).__name__}")
    return row
