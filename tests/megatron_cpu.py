"""megatron-core on CPU, for tests only: a test module asks for it with `pytest_plugins = ["megatron_cpu"]`.

megatron-core 0.16 builds, trains and checkpoints a GPTModel with the local layer spec on CPU over
gloo, except at three places that assume a GPU. `cuda_touch_points_on_cpu` patches exactly those, and
only while a test runs; the library path never does:

- `torch.cuda.current_device()`, which Megatron passes as a device: RotaryEmbedding moves its inverse
  frequencies there, the global memory buffer allocates the attention scores there
  (DotProductAttention), and the checkpoint saver reduces its failure flag there. Answering "cpu"
  keeps all of them on the CPU.
- `CudaRNGStatesTracker.fork`, which swaps the CUDA generator's state around attention dropout so that
  tensor-parallel ranks draw different masks; unpatched it raises "cuda rng state model-parallel-rng is
  not added" (only CUDA generators can be added). The backend's dropout is 0, so the fork has nothing
  to protect: it becomes a no-op.
- `torch.cuda.synchronize()`, which dist_checkpointing's writer calls after staging tensors to host
  memory (non-blocking copies from the GPU). On CPU nothing is in flight: a no-op.

The unpatched run of the same checks is the GPU test in test_train_megatron.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from ci import require_module


@contextlib.contextmanager
def cuda_touch_points_on_cpu() -> Iterator[None]:
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "current_device", lambda: "cpu")
        patch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        patch.setattr(CudaRNGStatesTracker, "fork", lambda self, name=None: contextlib.nullcontext())
        yield


@contextlib.contextmanager
def model_parallel(tensor_parallel_size: int = 1, *, rank: int = 0, world_size: int = 1,
                   store: dist.Store | None = None) -> Iterator[None]:
    """A gloo process group and megatron-core's parallel state over it, torn down after."""
    from megatron.core import parallel_state as mpu

    dist.init_process_group("gloo", store=store or dist.HashStore(), rank=rank, world_size=world_size)
    try:
        mpu.initialize_model_parallel(tensor_parallel_size, 1)
        yield
    finally:
        mpu.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.fixture
def megatron_cpu() -> Iterator[None]:
    """One rank, tensor_parallel_size 1, with the CUDA touch points patched for the test."""
    require_module("megatron.core", "the Megatron CPU tests", "pip install -e '.[megatron]'")
    with cuda_touch_points_on_cpu(), model_parallel():
        yield
