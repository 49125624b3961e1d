"""An episode's model calls as a tree of turns, and the chains it yields: one training sample each.

Each call re-sends the whole conversation, so a turn's prompt normally starts with the previous
turn's prompt + output (CLEAN) and the episode is one token sequence: one sample. The tree mounts
every turn under the turn whose history it continues, so that drift costs little:

    CLEAN    some turn's held sequence (prompt + kept output) is a prefix of the prompt
    REALIGN  the prompt re-renders the last few output tokens of a leaf differently: the leaf keeps
             training only the tokens before the divergence, the rest is prompt (mask 0)
    FORK     nothing matches: a new root, a new sample
    ROOT     the session's first turn

Where both a CLEAN and a REALIGN mount are possible, the one that matches more of the prompt wins
(ties go to CLEAN, which loses nothing, then to the newest turn): otherwise drift at the end of a
chain would branch at the chain's second-to-last turn, one sample per turn.

Each root-to-leaf chain is one sample (`Chain`; `Chain.to_sample` once the attempt is graded, the
`Chain.to_json` form for finish_session). A turn on several chains (the trunk under a sub-agent or a
retry) is trained only in the first of them, taking leaves in the order they were created.

Ids are kept as int32 bytes: prefix checks are memcmp (`bytes.startswith` at an offset), and a
turn stores only the prompt tokens past its parent's held sequence, so a session costs memory in
proportion to its longest history, not to the sum of its prompts.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpc.inference.routing import NO_ROUTE

from ..sample import ROUTE_DTYPE, UNKNOWN_VERSION, AttemptMetadata, Sample, SampleMetadata

_ITEM = np.dtype(np.int32).itemsize


def _frozen(values, dtype) -> np.ndarray:
    # An array that is already read-only (the adapter's prompt ids) is kept, not copied.
    if isinstance(values, np.ndarray) and values.dtype == dtype and not values.flags.writeable:
        return values
    array = np.array(values, dtype=dtype)
    if array.ndim != 1:
        raise ValueError(f"expected a flat sequence, got shape {array.shape}")
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class Turn:
    """One model call. Ids and logprobs are stored as read-only numpy arrays (int32, float64)."""

    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    output_logprobs: Sequence[float]
    finish_reason: str
    ill_formed: bool = False
    weight_version: int | None = None
    meta: Mapping = field(default_factory=dict)
    # An MoE's routes (SGLang's return_routed_experts): [rows, layers x top_k] for the positions
    # [routes_start, len(prompt) + len(output) - 1), every token the server fed; None: not asked for.
    routes: np.ndarray | None = None
    routes_start: int = 0

    def __post_init__(self):
        output = _frozen(self.output_ids, np.int32)
        logprobs = _frozen(self.output_logprobs, np.float64)
        prompt = _frozen(self.prompt_ids, np.int32)
        if not len(prompt):
            raise ValueError("empty prompt")    # it would be a prefix of every later prompt
        if len(logprobs) != len(output):
            raise ValueError(f"{len(output)} output ids but {len(logprobs)} logprobs")
        if self.routes is not None:
            fed = len(prompt) + max(len(output), 1) - 1
            if self.routes.ndim != 2 or len(self.routes) != fed - self.routes_start:
                raise ValueError(f"routes of shape {self.routes.shape} for positions [{self.routes_start}, {fed})")
        object.__setattr__(self, "prompt_ids", prompt)
        object.__setattr__(self, "output_ids", output)
        object.__setattr__(self, "output_logprobs", logprobs)


class Drift(enum.Enum):
    ROOT = "root"
    CLEAN = "clean"
    REALIGN = "realign"
    FORK = "fork"


@dataclass(frozen=True)
class TurnSpan:
    """Where one turn of a chain sits in its sample's response (offsets into tokens[prompt_length:]).

    Its output is response[start:start + generated]; the first `kept` of those stay the model's. Past
    them (kept < generated: a later turn REALIGNed it) the next turn's prompt re-rendered the text,
    so those positions hold prompt tokens, not the ones the model sampled.
    """

    start: int
    generated: int
    kept: int
    drift: str                  # how the turn mounted (Drift values): a chain's first is root or fork
    trained: bool               # its kept tokens are trained in this sample (not in an earlier chain)
    weight_version: int | None


@dataclass(frozen=True)
class Chain:
    """One chain's token sequence. loss_mask and rollout_log_probs cover the response only.

    weight_versions and ill_formed_turns describe the turns this sample trains (at least one
    mask-1 token here): each turn is trained in one sample only, so sums over samples count it once.
    """

    tokens: list[int]
    prompt_length: int
    loss_mask: list[int]
    rollout_log_probs: list[float]
    token_versions: list[int]                    # per response token, its turn's weight version (-1: none)
    turns: int                                   # turns on the chain, trained here or not
    trained_tokens: int
    weight_versions: tuple[int, int] | None      # (oldest, newest); None when no trained turn has one
    finish_reason: str                           # the leaf's
    ill_formed_turns: int
    metas: tuple[Mapping, ...]                   # the chain's turns', root first
    spans: tuple[TurnSpan, ...] = ()             # the chain's turns, root first: where each is in the response
    routed_experts: np.ndarray | None = None     # per token, an MoE's routes (Sample.routed_experts); not in to_json

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def to_json(self) -> dict[str, Any]:
        """The chain as the finish_session route returns it (docs/adapter.md)."""
        return {"tokens": list(self.tokens), "prompt_length": self.prompt_length,
                "response_length": self.response_length, "loss_mask": list(self.loss_mask),
                "rollout_log_probs": list(self.rollout_log_probs), "token_versions": list(self.token_versions),
                "turns": self.turns,
                "trained_tokens": self.trained_tokens, "weight_versions": self.weight_versions,
                "finish_reason": self.finish_reason, "truncated": self.truncated,
                "ill_formed_turns": self.ill_formed_turns}

    def to_sample(self, *, reward: float, group_index: int, attempt: int, metadata: AttemptMetadata) -> Sample:
        """The training sample of this chain, once its attempt is graded: the attempt's reward and metadata."""
        recorded = SampleMetadata(**metadata.model_dump(), chain_turns=self.turns,
                                  trained_tokens=self.trained_tokens,
                                  weight_version=self.weight_versions[1] if self.weight_versions else None,
                                  truncated=self.truncated, ill_formed_turns=self.ill_formed_turns)
        return Sample(tokens=np.asarray(self.tokens, np.int32), response_length=self.response_length,
                      loss_mask=np.asarray(self.loss_mask, np.uint8),
                      rollout_log_probs=np.asarray(self.rollout_log_probs, np.float32),
                      token_versions=np.asarray(self.token_versions, np.int32), reward=reward,
                      status="completed", group_index=group_index, attempt=attempt, metadata=recorded,
                      routed_experts=self.routed_experts)


@dataclass(eq=False, slots=True)
class _Node:
    index: int                  # creation order
    parent: _Node | None
    start: int                  # the parent's held length when mounted: where tail begins
    tail: bytes                 # prompt tokens past the parent's held sequence
    prompt_length: int
    output_ids: np.ndarray
    output_logprobs: np.ndarray
    kept: int                   # output tokens that stay trained; fewer only after a REALIGN
    kept_bytes: bytes
    finish_reason: str
    ill_formed: bool
    weight_version: int | None
    meta: Mapping
    drift: Drift
    routes: np.ndarray | None
    routes_start: int
    children: list[_Node] = field(default_factory=list)

    @property
    def held_length(self) -> int:
        return self.prompt_length + self.kept

    def chain(self) -> list[_Node]:
        nodes: list[_Node] = []
        node: _Node | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]


class TrajectoryTree:
    """The turns of one session. `samples()` drops chains with no trained token (all of them
    trained elsewhere or empty): `chains - len(samples())` of them."""

    def __init__(self, realign_window: int = 32):
        if realign_window < 0:
            raise ValueError("realign_window must be >= 0")
        self.realign_window = realign_window
        self._nodes: list[_Node] = []
        self._roots: list[_Node] = []
        self._counts = dict.fromkeys(Drift, 0)
        self._branches = 0
        self._last_prompt = b""     # the newest turn's whole prompt, for the one-chain fast path

    @property
    def turns(self) -> int:
        return len(self._nodes)

    @property
    def counts(self) -> dict[Drift, int]:
        return dict(self._counts)

    @property
    def branches(self) -> int:
        """Turns mounted under a turn that already had a child: each adds a chain (a sample)."""
        return self._branches

    @property
    def chains(self) -> int:
        return sum(not node.children for node in self._nodes)

    def add(self, turn: Turn) -> Drift:
        # The read-only arrays Turn.__post_init__ made, as such (_frozen returns them, no copy).
        prompt_ids, output_ids = _frozen(turn.prompt_ids, np.int32), _frozen(turn.output_ids, np.int32)
        haystack = prompt_ids.tobytes()
        parent, kept = self._mount_point(prompt_ids, haystack)
        if parent is None:
            drift = Drift.FORK if self._nodes else Drift.ROOT
        elif kept < parent.kept:
            drift = Drift.REALIGN
            parent.kept, parent.kept_bytes = kept, parent.output_ids[:kept].tobytes()
        else:
            drift = Drift.CLEAN
        start = parent.held_length if parent else 0
        # Not the turn itself: that would keep its whole prompt alive, where the tail suffices.
        node = _Node(len(self._nodes), parent, start, haystack[start * _ITEM:], len(prompt_ids),
                     output_ids, _frozen(turn.output_logprobs, np.float64), len(output_ids), output_ids.tobytes(),
                     turn.finish_reason, turn.ill_formed, turn.weight_version, turn.meta, drift, turn.routes,
                     turn.routes_start)
        if parent is None:
            self._roots.append(node)
        else:
            self._branches += bool(parent.children)
            parent.children.append(node)
        self._nodes.append(node)
        self._last_prompt = haystack
        self._counts[drift] += 1
        return drift

    def routes_start(self, prompt_ids: Sequence[int]) -> int:
        """From which position a turn with this prompt needs its routes (SGLang's routed_experts_start_len):
        the turn it will mount under holds those of every position before the last token it keeps (that
        token was never fed to the server, or a REALIGN re-rendered what follows it)."""
        prompt = _frozen(prompt_ids, np.int32)
        parent, kept = self._mount_point(prompt, prompt.tobytes())   # kept: less than the parent's on a REALIGN
        return 0 if parent is None else min(parent.prompt_length + kept - 1, len(prompt))

    def _mount_point(self, prompt: np.ndarray, haystack: bytes) -> tuple[_Node | None, int]:
        """The node to mount under and how many of its output tokens stay trained.

        Walks down from the roots: a node whose prompt is not a prefix has no descendant that is.
        A session that is still one chain (the usual case) first tries its leaf, which the walk
        would pick whenever its held sequence is a prefix: two compares instead of one per turn.
        """
        if len(self._roots) == 1 and not self._branches:
            leaf = self._nodes[-1]
            if (leaf.held_length <= len(prompt) and haystack.startswith(self._last_prompt)
                    and haystack.startswith(leaf.kept_bytes, leaf.prompt_length * _ITEM)):
                return leaf, leaf.kept
        best: tuple[_Node | None, int] = (None, 0)
        best_key = (-1, False, -1)     # (prompt tokens matched, clean, newest)
        stack = list(self._roots)
        while stack:
            node = stack.pop()
            if node.prompt_length > len(prompt) or not haystack.startswith(node.tail, node.start * _ITEM):
                continue
            if node.held_length <= len(prompt) and haystack.startswith(node.kept_bytes, node.prompt_length * _ITEM):
                kept, key = node.kept, (node.held_length, True, node.index)
                stack.extend(node.children)
            elif node.children:
                # Its children's prompts hold all of its kept output: truncating it would untrain
                # tokens their chains kept verbatim, or train the first chain on tokens it lacks.
                continue
            elif (cut := self._realign_cut(node, prompt)) is None:
                continue
            else:
                kept, key = cut, (node.prompt_length + cut, False, node.index)
            if key > best_key:
                best, best_key = (node, kept), key
        return best

    def _realign_cut(self, leaf: _Node, prompt: np.ndarray) -> int | None:
        """Where the prompt stops following the leaf's output, if within the window of its end."""
        output = leaf.output_ids
        span = prompt[leaf.prompt_length:leaf.prompt_length + len(output)]
        differs = span != output[:len(span)]
        if not differs.any():
            return None     # the prompt ends inside the output without contradicting it: a retry
        cut = int(differs.argmax())
        return cut if len(output) - cut <= self.realign_window else None

    def samples(self) -> list[Chain]:
        trained: set[int] = set()
        samples = []
        for leaf in self._nodes:
            if leaf.children:
                continue
            chain = leaf.chain()
            own = [node for node in chain if node.kept and node.index not in trained]
            trained.update(node.index for node in own)
            if own:
                samples.append(_sample(chain, own))
        return samples


def _sample(chain: list[_Node], own: list[_Node]) -> Chain:
    leaf = chain[-1]
    tokens = np.concatenate([np.frombuffer(node.tail + node.kept_bytes, np.int32) for node in chain])
    mask, logprobs = np.zeros(len(tokens), np.int8), np.zeros(len(tokens))
    versions = np.full(len(tokens), UNKNOWN_VERSION, np.int32)
    for node in chain:        # every model token, trained here or in a sibling: which weights wrote it
        if node.weight_version is not None:
            versions[node.prompt_length:node.held_length] = node.weight_version
    for node in own:
        trained = slice(node.prompt_length, node.held_length)
        mask[trained] = 1
        logprobs[trained] = node.output_logprobs[:node.kept]
    start = chain[0].prompt_length
    owned = {node.index for node in own}
    routes = None
    if widths := {node.routes.shape[1] for node in chain if node.routes is not None}:
        if len(widths) > 1:
            raise ValueError(f"a chain's turns carry routes of different widths {sorted(widths)}")
        routes = np.full((len(tokens), widths.pop()), NO_ROUTE, ROUTE_DTYPE)
        for node in chain:        # root first: a child's rows replace the overlap (the same tokens, fed again)
            if node.routes is not None:
                end = min(node.routes_start + len(node.routes), node.held_length)
                routes[node.routes_start:end] = node.routes[:end - node.routes_start]
    trained_versions = [node.weight_version for node in own if node.weight_version is not None]
    return Chain(
        tokens=tokens.tolist(),
        prompt_length=start,
        loss_mask=mask[start:].tolist(),
        rollout_log_probs=logprobs[start:].tolist(),
        token_versions=versions[start:].tolist(),
        turns=len(chain),
        trained_tokens=sum(node.kept for node in own),
        weight_versions=(min(trained_versions), max(trained_versions)) if trained_versions else None,
        finish_reason=leaf.finish_reason,
        ill_formed_turns=sum(node.ill_formed for node in own),
        metas=tuple(node.meta for node in chain),
        spans=tuple(TurnSpan(node.prompt_length - start, len(node.output_ids), node.kept, node.drift.value,
                             node.index in owned, node.weight_version) for node in chain),
        routed_experts=routes,
    )
