"""A stand-in for the rollout pool: claims attempts from the ledger and commits real sample shards.

The samples are deterministic in (rollout, group, attempt): tokens from the tiny vocabulary, a
reward that depends on the attempt, and some attempts fanned out into two samples, so runs that
should agree (one uninterrupted, one resumed) see the same data.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from agentrl.sample import SAMPLE_CODEC, Sample, SampleMetadata
from hpc.buffer import write_shard
from hpc.ledger import Claim, Ledger

VOCAB = 4000


def samples_for(rollout: int, group: int, attempt: int, version: int | None = None) -> list[Sample]:
    """The attempt's samples; their model tokens written by weights `version` (None: unknown)."""
    rng = np.random.default_rng([rollout, group, attempt])
    reward = float((attempt + group) % 2)
    metadata = SampleMetadata(weight_version=0, empty_patch="not_triggered", drift={"clean": 2}, agent_s=1.0)
    out = []
    for _ in range(2 if attempt == 1 else 1):
        prompt, response = int(rng.integers(8, 24)), int(rng.integers(4, 16))
        tokens = rng.integers(10, VOCAB - 10, prompt + response).astype(np.int32)
        mask = np.ones(response, np.uint8)
        mask[: response // 4] = 0                 # a tool result inside the response: not trained
        versions = np.where(mask == 1, -1 if version is None else version, -1)
        out.append(Sample(tokens=tokens, response_length=response, loss_mask=mask, token_versions=versions,
                          rollout_log_probs=-rng.uniform(0.5, 3.0, response).astype(np.float32), reward=reward,
                          status="completed", group_index=group, attempt=attempt, metadata=metadata))
    return out


class FakePool:
    """`with FakePool(run_dir):` commits every attempt of every open rollout until the block ends."""

    def __init__(self, run_dir: Path, worker_id: str = "fake-pool", poll_s: float = 0.05,
                 version: Callable[[Claim], int | None] = lambda claim: None):
        self.run_dir, self.worker_id, self.poll_s, self.version = Path(run_dir), worker_id, poll_s, version
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.committed: list[tuple[int, int, int]] = []

    def _loop(self) -> None:
        ledger = None
        while not self._stop.is_set():
            if ledger is None:
                if not (self.run_dir / "ledger" / "ledger.json").exists():
                    self._stop.wait(self.poll_s)
                    continue
                ledger = Ledger(self.run_dir / "ledger")
            claim = ledger.claim(self.worker_id, lease_s=60)
            if claim is None:
                self._stop.wait(self.poll_s)
                continue
            samples = samples_for(claim.rollout_id, claim.group, claim.attempt, self.version(claim))
            ref = write_shard(self.run_dir / "buffer", claim, samples, SAMPLE_CODEC)
            if ledger.commit(claim, ref):
                self.committed.append((claim.rollout_id, claim.group, claim.attempt))

    def __enter__(self) -> FakePool:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
