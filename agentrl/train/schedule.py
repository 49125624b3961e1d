"""Which samples train together: steps of whole attempts, token-capped micro-batches, and data-parallel ranks.

A micro-batch is a list of sample indices (ascending) whose tokens are packed into one forward pass.
Samples are first packed first-fit decreasing into micro-batches of at most `max_tokens_per_gpu` tokens;
the micro-batch count is then made a multiple of `dp_size`, so every rank runs the same number, by
splitting micro-batches or, when every one already holds a single sample, by merging them
longest-processing-time-first (LPT). Merging is the only way a micro-batch of several samples can
exceed the cap, and it is logged as a warning.
"""

from __future__ import annotations

import heapq
import logging
import operator
from collections.abc import Callable, Hashable, Sequence

log = logging.getLogger(__name__)

MicroBatch = list[int]
Merge = Callable[[list[MicroBatch], Sequence[int], int], list[MicroBatch]]


def build_schedule(lengths: Sequence[int], attempt_ids: Sequence[Hashable], *, max_tokens_per_gpu: int,
                   dp_size: int, global_batch_size: int | None = None) -> list[MicroBatch]:
    """The micro-batches of one step holding every sample, largest first; their count is a multiple of dp_size.

    `lengths[i]` is sample i's token count (prompt and response), `attempt_ids[i]` its attempt, unique
    across the whole batch (pass (group, attempt) pairs where ids repeat across groups). All samples form
    one step; `global_batch_size`, when given, must equal the number of distinct attempts, a guard against
    handing one step more or less than was meant (use `build_steps` to cut a rollout into steps).

    A sample longer than `max_tokens_per_gpu` gets a micro-batch of its own and a warning. Raises
    ValueError when there are fewer samples than `dp_size`: some rank would get nothing to train on.
    """
    lengths = _checked(lengths, attempt_ids, max_tokens_per_gpu, dp_size)
    if global_batch_size is not None:
        attempts = len(set(attempt_ids))
        if global_batch_size != attempts:
            raise ValueError(f"global_batch_size={global_batch_size} but the samples hold {attempts} attempts: "
                             f"build_schedule schedules exactly one step; cut a rollout into steps with build_steps")
    return _schedule(range(len(lengths)), lengths, max_tokens_per_gpu, dp_size, _merge_lpt)


def build_steps(lengths: Sequence[int], attempt_ids: Sequence[Hashable], *, max_tokens_per_gpu: int,
                dp_size: int, global_batch_size: int) -> list[list[MicroBatch]]:
    """Steps of `global_batch_size` attempts each, as `build_schedule` micro-batches of the original indices.

    Attempts are taken in order of first appearance, and all samples of an attempt go to the same step, so
    the per-attempt loss normalisation sees the whole attempt. When the attempt count is not a multiple of
    `global_batch_size`, the last step holds the remainder; it raises ValueError if that remainder has
    fewer samples than `dp_size`.
    """
    lengths = _checked(lengths, attempt_ids, max_tokens_per_gpu, dp_size)
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be at least 1, got {global_batch_size}")
    samples_of: dict[Hashable, list[int]] = {}
    for i, attempt in enumerate(attempt_ids):
        samples_of.setdefault(attempt, []).append(i)
    attempts = list(samples_of.values())
    steps = []
    for start in range(0, len(attempts), global_batch_size):
        indices = sorted(i for samples in attempts[start:start + global_batch_size] for i in samples)
        if len(indices) < dp_size and start + global_batch_size > len(attempts):
            raise ValueError(f"the last step holds the {len(attempts) - start} of {len(attempts)} attempts left "
                             f"over by steps of global_batch_size={global_batch_size}, {len(indices)} samples for "
                             f"dp_size={dp_size}: make the rollout's attempt count a multiple of global_batch_size")
        steps.append(_schedule(indices, lengths, max_tokens_per_gpu, dp_size, _merge_lpt))
    return steps


def assign_ranks(micro_batches: Sequence[MicroBatch], lengths: Sequence[int], *,
                 dp_size: int) -> list[list[MicroBatch]]:
    """Deal micro-batches to `dp_size` ranks, the same number each, balancing tokens per rank (LPT).

    Each rank's micro-batches come largest first: FSDP's collectives make the j-th micro-batch of every
    rank run in lockstep, so lining up similar sizes keeps ranks from waiting on each other.
    """
    if dp_size < 1 or len(micro_batches) % dp_size:
        raise ValueError(f"{len(micro_batches)} micro-batches cannot be dealt evenly to dp_size={dp_size} ranks")
    per_rank = len(micro_batches) // dp_size
    ranks: list[list[MicroBatch]] = [[] for _ in range(dp_size)]
    tokens = [0] * dp_size
    for mb in sorted(micro_batches, key=lambda mb: (-_tokens(mb, lengths), mb)):
        rank = min((r for r in range(dp_size) if len(ranks[r]) < per_rank), key=lambda r: (tokens[r], r))
        ranks[rank].append(list(mb))
        tokens[rank] += _tokens(mb, lengths)
    return ranks


def _checked(lengths: Sequence[int], attempt_ids: Sequence[Hashable], max_tokens_per_gpu: int,
             dp_size: int) -> list[int]:
    lengths = [operator.index(n) for n in lengths]
    if len(lengths) != len(attempt_ids):
        raise ValueError(f"{len(lengths)} lengths but {len(attempt_ids)} attempt ids: need one of each per sample")
    if any(n < 1 for n in lengths):
        raise ValueError(f"sample {next(i for i, n in enumerate(lengths) if n < 1)} has no tokens")
    if max_tokens_per_gpu < 1 or dp_size < 1:
        raise ValueError(f"max_tokens_per_gpu and dp_size must be positive, got {max_tokens_per_gpu} and {dp_size}")
    return lengths


def _schedule(indices: Sequence[int], lengths: Sequence[int], cap: int, dp_size: int,
              merge: Merge) -> list[MicroBatch]:
    if len(indices) < dp_size:
        raise ValueError(f"{len(indices)} samples cannot fill dp_size={dp_size} micro-batches: raise the rollout "
                         f"batch size or n_samples_per_prompt, or lower dp")
    too_long = [i for i in indices if lengths[i] > cap]
    if too_long:
        log.warning("%d samples exceed max_tokens_per_gpu=%d (longest %d tokens) and get a micro-batch each: keep "
                    "the rollout context length (max_context) within max_tokens_per_gpu",
                    len(too_long), cap, max(lengths[i] for i in too_long))
    bins = _balance(_align(_first_fit_decreasing(indices, lengths, cap), lengths, dp_size, merge), lengths, cap)
    merged_over = [_tokens(b, lengths) for b in bins if len(b) > 1 and _tokens(b, lengths) > cap]
    if merged_over:
        log.warning("%d micro-batches exceed max_tokens_per_gpu=%d (largest %d tokens): merging was the only way "
                    "to deal %d long samples into a multiple of dp_size=%d micro-batches; lower the rollout context "
                    "length (max_context), or choose a batch shape (attempts per step x n_samples_per_prompt) "
                    "whose sample count divides by dp_size",
                    len(merged_over), cap, max(merged_over), len(indices), dp_size)
    return sorted((sorted(b) for b in bins), key=lambda b: (-_tokens(b, lengths), b))


def _first_fit_decreasing(indices: Sequence[int], lengths: Sequence[int], cap: int) -> list[MicroBatch]:
    bins: list[MicroBatch] = []
    loads: list[int] = []
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        for b, load in enumerate(loads):
            if load + lengths[i] <= cap:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return bins


def _align(bins: list[MicroBatch], lengths: Sequence[int], dp_size: int, merge: Merge) -> list[MicroBatch]:
    """Split the largest splittable bin in two until the count is a multiple of dp_size; merge if none is left.

    Splitting never breaks the cap, so it comes first. Merging therefore only ever starts from bins of one
    sample each, n of them into k = n - n % dp_size >= n / 2 bins, where no bin needs more than two
    samples and LPT is optimal.
    """
    bins = [list(b) for b in bins]
    while len(bins) % dp_size:
        splittable = [b for b in range(len(bins)) if len(bins[b]) > 1]
        if not splittable:
            return merge(bins, lengths, len(bins) - len(bins) % dp_size)
        largest = max(splittable, key=lambda b: (_tokens(bins[b], lengths), -b))
        bins.extend(_merge_lpt([[i] for i in bins.pop(largest)], lengths, 2))
    return bins


def _balance(bins: list[MicroBatch], lengths: Sequence[int], cap: int) -> list[MicroBatch]:
    """The same number of micro-batches, re-dealt by LPT when that lowers the largest without breaking the cap.

    First-fit decreasing finds few bins but fills the first ones and leaves the last light; the step
    waits for its largest micro-batch, so spreading the same samples evenly is free time.
    """
    dealt = _merge_lpt([[i] for b in bins for i in b], lengths, len(bins))
    largest = max(_tokens(b, lengths) for b in bins)
    new_largest = max(_tokens(b, lengths) for b in dealt)
    if new_largest < largest and all(_tokens(b, lengths) <= cap or len(b) == 1 for b in dealt) \
            and all(b for b in dealt):
        return dealt
    return bins


def _merge_lpt(units: list[MicroBatch], lengths: Sequence[int], k: int) -> list[MicroBatch]:
    """Pack units into k bins, largest unit first, each into the bin with the fewest tokens so far."""
    heap = [(0, b) for b in range(k)]
    bins: list[MicroBatch] = [[] for _ in range(k)]
    for unit in sorted(units, key=lambda u: (-_tokens(u, lengths), u)):
        load, b = heapq.heappop(heap)
        bins[b].extend(unit)
        heapq.heappush(heap, (load + _tokens(unit, lengths), b))
    return bins


def _merge_two_smallest(units: list[MicroBatch], lengths: Sequence[int], k: int) -> list[MicroBatch]:
    """The naive merge, for comparison only: join the two smallest bins until k are left.

    It lets an early merge grow into the smallest bin again, so it can stack three samples where LPT
    pairs two: [49000, 49000, 90000, 90000, 90000] into 3 bins gives 180000 here, 139000 with LPT.
    """
    heap = [(_tokens(u, lengths), u) for u in units]
    heapq.heapify(heap)
    while len(heap) > k:
        (a_load, a), (b_load, b) = heapq.heappop(heap), heapq.heappop(heap)
        heapq.heappush(heap, (a_load + b_load, sorted(a + b)))
    return [u for _, u in heap]


def _tokens(micro_batch: Sequence[int], lengths: Sequence[int]) -> int:
    return sum(lengths[i] for i in micro_batch)
