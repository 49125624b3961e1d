"""benchmarks/routing_replay_bench.py, small: replay narrows the bfloat16 sampler / float32 trainer gap on the tiny
MoE, and a replay that ignores the recorded experts brings the gap back."""

from contextlib import contextmanager

import pytest

from benchmarks import routing_replay_bench as bench
from hpc.inference import routing

pytestmark = pytest.mark.integration    # a model built, served in-process and trained

SMALL = bench.Options(prompts=4, new_tokens=24)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("r3")


def test_replay_narrows_the_gap_and_the_report_prints_what_was_measured(work):
    result = bench.measure(work, SMALL)
    assert result["routes_differ"] > 0, "bfloat16 and float32 chose the same routes: nothing to replay here"
    on, off = result["on"], result["off"]
    assert on["mismatch_mean"] < off["mismatch_mean"] and on["mismatch_max"] < off["mismatch_max"]
    assert on["mismatch_k3"] < off["mismatch_k3"] and on["mismatch_tokens"] == off["mismatch_tokens"] == 96
    text = bench.report(result)
    for k in bench.FIGURES:
        ratio = result["ratio"][k]
        assert ratio is None or ratio == pytest.approx(on[k] / off[k])
        assert f"{k:<16}{on[k]:>12.4g}{off[k]:>13.4g}{'n/a' if ratio is None else f'{ratio:.3f}':>10}" in text


def test_a_replay_that_ignores_the_recorded_experts_brings_the_mismatch_back(work, monkeypatch):
    @contextmanager
    def ignoring(model, routes):
        yield           # the routers keep their own choice: what replay off does

    monkeypatch.setattr(routing, "replay", ignoring)
    model = bench.sharp_moe(work, SMALL)
    samples = bench.sampled(model, SMALL)
    on, off = (bench.trainer_mismatch(model, samples, replay=r) for r in (True, False))
    assert on == pytest.approx(off)
    assert off["mismatch_max"] > 0.2        # the gap replay closes in the test above


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="needs a CUDA GPU (tools/gpu_check.sh runs it there)")
def test_on_a_gpu_replay_narrows_the_gap(work):
    """The stand-in's bfloat16 forward and the torch trainer on the GPU (tools/gpu_check.sh, check moe)."""
    result = bench.measure(work, bench.Options(prompts=4, new_tokens=24, device="cuda"))
    print(bench.report(result))
    assert result["on"]["mismatch_mean"] < result["off"]["mismatch_mean"]
    assert result["on"]["mismatch_max"] <= result["off"]["mismatch_max"]
