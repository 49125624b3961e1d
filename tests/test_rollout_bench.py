"""The rollout benchmark runs a real pool worker end to end in --quick mode and reports consistent figures."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from ci import skip_or_fail

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "benchmarks.rollout_bench"]     # run from ROOT
SHARES = ("boot", "queue", "agent", "grade", "overhead")
OVERHEAD_PARTS = ("claim", "dispatch", "bookkeeping", "teardown", "shard", "commit", "handoff")


@pytest.fixture
def runnable():
    why = None
    if os.geteuid() != 0:
        why = "the rollout benchmark needs root (bwrap sandboxes with overlay mounts)"
    elif missing := [t for t in ("bwrap", "nsenter") if shutil.which(t) is None]:
        why = f"the rollout benchmark needs {' and '.join(missing)} (make sysdeps)"
    if why:
        skip_or_fail("the rollout benchmark's test", why)


@pytest.fixture
def short_dir():
    """pytest's tmp_path is too deep for the pool adapter's Unix socket path under it."""
    path = Path(tempfile.mkdtemp(prefix="rb-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_quick_run_reports_rollouts_per_hour_and_the_overhead_beside_its_target(runnable, short_dir):
    p = subprocess.run([*BENCH, "--quick", "--json", "--dir", str(short_dir)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["benchmark"] == "rollout" and out["quick"] is True and out["cpus"] >= 1
    assert len(out["tasks"]) >= 2 and out["policy_tokens"]["call"] > 0
    assert out["target"] == {"max_overhead_share": 0.03}
    assert "definitions" in p.stdout and "(c) the overhead" in p.stdout and "target: overhead <= 3%" in p.stdout

    levels = out["levels"]
    assert [(r["concurrency"], r["attempts"]) for r in levels] == [(1, 2), (2, 4)]
    for r in levels:
        assert r["max_agents"] == r["concurrency"] and r["max_booting"] == min(r["concurrency"], 4)
        assert r["batch_wall_s"] > 0 and r["rollouts_per_hour"] > 0
        assert r["rollouts_per_hour"] == pytest.approx(r["attempts"] / r["batch_wall_s"] * 3600, rel=1e-2)
        assert 0 < r["attempt_wall_p50_s"] <= r["attempt_wall_p95_s"] <= r["batch_wall_s"] + 1e-3
        assert 0 < r["cpu_busy"] <= 1
        shares = r["shares"]
        assert set(shares) == set(SHARES) and sum(shares.values()) == pytest.approx(1, abs=1e-3)
        assert all(shares[k] > 0 for k in ("boot", "agent", "grade")) and shares["queue"] >= 0
        assert 0 < r["overhead_share"] < 1 and r["overhead_share"] == shares["overhead"]
        assert r["overhead_share"] <= r["overhead_share_without_queue"] < 1
        assert r["broad_overhead_share"] == pytest.approx(shares["overhead"] + shares["boot"], abs=2e-4)
        assert r["overhead_ratio_to_target"] == pytest.approx(r["overhead_share"] / 0.03, rel=1e-2)
        assert r["meets_target"] == (r["overhead_share"] <= 0.03)
        assert 0 < r["generation_share"] < shares["agent"] and 0 < r["adapter_share"] < shares["agent"]
        assert set(r["overhead_ms"]) == set(OVERHEAD_PARTS) and all(v > 0 for v in r["overhead_ms"].values())
    assert out["meets_target"] == all(r["meets_target"] for r in levels)
    # Nothing is left mounted or behind.
    assert str(short_dir) not in Path("/proc/mounts").read_text()
    assert not [d for d in short_dir.iterdir() if d.name.startswith("run-")]


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "1,x"], "--concurrency must be positive integers"),
    (["--concurrency", "2,2"], "--concurrency has a repeated value"),
    (["--attempts", "3"], "--attempts must be a positive multiple of 2"),
    (["--max-booting", "0"], "--max-booting must be at least 1"),
])
def test_bad_arguments_are_refused(args, message):
    p = subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and message in p.stderr, p.stderr
