"""The `agentrl` command, the benchmark's --json contract, and tools/sysdeps.sh off root."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agentrl.cli import build_parser, main
from hpc.ledger import Ledger
from hpc.runlayout import RunLayout

ROOT = Path(__file__).resolve().parents[1]


def test_every_subcommand_has_help(capsys):
    parser = build_parser()
    subs = parser._subparsers._group_actions[0].choices
    assert {"cluster", "ledger"} <= set(subs)
    for name in subs:
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0
        assert "usage: agentrl " + name in capsys.readouterr().out


def test_ledger_status_of_a_run(tmp_path, capsys):
    layout = RunLayout.create(tmp_path / "run", run_id="r1")
    led = Ledger(layout.ledger_dir)
    led.open_rollout(0, [0, 1], 2)
    led.commit(led.claim("w"), "ref")
    assert main(["ledger", "status", str(layout.root), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["rollout_id"], row["total"], row["committed"], row["claimed"], row["pending"]) == (0, 4, 1, 0, 3)
    assert main(["ledger", "status", str(tmp_path)]) == 2
    assert "holds no ledger" in capsys.readouterr().err


@pytest.mark.integration
def test_benchmark_prints_its_figures_as_json_last(tmp_path):
    (shared := tmp_path / "shared").mkdir()
    (local := tmp_path / "local").mkdir()
    r = subprocess.run([sys.executable, "-m", "benchmarks.ledger_bench", "--procs", "1,2", "--pairs", "64",
                        "--outstanding", "40,400", "--workers", "50", "--dir", str(shared), "--beside", str(local),
                        "--json"], capture_output=True, text=True, timeout=120, check=True, cwd=ROOT)
    figures = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row["procs"] for row in figures["results"]] == [1, 2]
    # --beside: the throughput rows again on the second filesystem, and today's pairs/s on each with the ratio
    assert figures["beside"]["filesystem"] == str(local)
    assert [row["procs"] for row in figures["beside"]["results"]] == [1, 2]
    ratios = [line.split()[-1] for line in r.stdout.split(f"beside {local}\n")[1].splitlines()[1:3]]
    assert ratios == [f"{a['after']['pairs_per_s'] / b['after']['pairs_per_s']:.2f}x"
                      for a, b in zip(figures["results"], figures["beside"]["results"], strict=True)]
    for row in figures["results"] + figures["beside"]["results"]:
        assert row["floor_ops_per_s"] > 0 and row["floor_op_p99_ms"] >= row["floor_op_p50_ms"] > 0
        for design in ("before", "after"):     # the claim before issue 17 beside today's, in the same run
            m = row[design]
            assert m["pairs"] >= 64 and m["pairs_per_s"] > 0 and m["claim_p99_ms"] >= m["claim_p50_ms"] > 0
            assert m["ratio_to_floor"] == pytest.approx(m["pairs_per_s"] / row["floor_ops_per_s"], rel=0.01)
    # Others hold half of the attempts; before and after, 16 workers claim 4 each of the rest, and then 50
    # workers 2 each, until none is left unclaimed.
    assert [(row["outstanding"], row["before"]["pairs"], row["after"]["pairs"], row["after_many"]["pairs"])
            for row in figures["scale"]] == [(40, 20, 20, 20), (400, 64, 64, 100)]
    for row in figures["scale"]:
        for design in ("before", "after", "after_many"):
            m = row[design]
            assert 0 < m["stats_per_pair"] < m["calls_per_pair"] <= m["max_calls"]
            assert m["pair_p99_ms"] >= m["pair_p50_ms"] > 0
        assert row["after_many"]["calls_per_pair"] <= 40
        assert row["ratio"] == pytest.approx(row["before"]["calls_per_pair"] / row["after"]["calls_per_pair"], abs=0.1)
    for flag, value, message in (("--procs", "0", "--procs must be positive integers"),
                                 ("--outstanding", "1", "--outstanding must be integers of at least 2"),
                                 ("--workers", "0", "--workers must be at least 1"),
                                 ("--beside", str(tmp_path / "nowhere"), "is not a directory")):
        bad = subprocess.run([sys.executable, "-m", "benchmarks.ledger_bench", flag, value],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert bad.returncode == 2 and message in bad.stderr


@pytest.mark.integration
def test_every_benchmark_runs_as_a_script_too():
    """`python benchmarks/X.py`, as a newcomer types it, finds the checkout's `benchmarks` package as
    `python -m benchmarks.X` does (the form the other benchmark tests run)."""
    names = sorted(p.stem for p in (ROOT / "benchmarks").glob("*_bench.py"))
    runs = {name: subprocess.Popen([sys.executable, f"benchmarks/{name}.py", "--help"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=ROOT) for name in names}
    for name, p in runs.items():
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and "usage:" in out, (name, err[-2000:])
    assert len(names) >= 9


def test_file_system_calls_are_counted_by_name_and_the_real_functions_put_back(tmp_path):
    import io
    import os

    from benchmarks.fs_calls import counted

    real_stat, real_open = os.stat, io.open
    with counted() as calls:
        (tmp_path / "f").write_text("x")
        assert (tmp_path / "f").exists() and not os.path.lexists(tmp_path / "g")
        os.listdir(tmp_path)
    assert dict(calls) == {"open": 1, "stat": 1, "lstat": 1, "listdir": 1}
    assert (os.stat, io.open) == (real_stat, real_open)


def test_the_benchmarks_percentile_is_numpys_default():
    import numpy as np

    from benchmarks import common

    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 101):
        xs = rng.exponential(size=n).tolist()
        for q in (0, 0.01, 0.5, 0.95, 0.99, 1):
            assert common.percentile(xs, q) == pytest.approx(float(np.quantile(xs, q)), rel=1e-12)
    assert common.percentile([4, 1, 3, 2], 0.5) == 2.5          # the median, not an element
    for bad in ([], [1.0]):
        with pytest.raises(ValueError):
            common.percentile(bad, 1.5 if bad else 0.5)


def test_the_benchmarks_stop_a_child_with_sigterm_and_kill_one_that_ignores_it():
    import subprocess

    from benchmarks import common

    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    common.stop(polite, grace_s=10)
    assert polite.returncode == -15                       # SIGTERM was enough
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline() == "ready\n"
    common.stop(stubborn, grace_s=0.5)
    assert stubborn.returncode == -9
    common.stop(stubborn)                                  # already ended: nothing to do


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to run the script as an unprivileged user")
@pytest.mark.integration
def test_sysdeps_off_root_names_what_is_missing_and_never_runs_apt():
    # Outside pytest's tmp_path, which is private to root.
    work = Path(tempfile.mkdtemp(prefix="sysdeps-"))
    try:
        work.chmod(0o755)
        bin_dir = work / "bin"
        bin_dir.mkdir()
        for tool in ("bash", "id", "sort", "tr", "cat"):
            os.symlink(shutil.which(tool), bin_dir / tool)
        # A fake apt-get that would leave a mark if the script ever called it.
        (bin_dir / "apt-get").write_text(f"#!/bin/sh\necho ran > {work}/apt-ran\n")
        (bin_dir / "apt-get").chmod(0o755)
        shutil.copy(ROOT / "tools/sysdeps.sh", work / "sysdeps.sh")
        r = subprocess.run([shutil.which("setpriv"), "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                            str(bin_dir / "bash"), str(work / "sysdeps.sh")],
                           env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=30)
        assert r.returncode == 1, r.stderr
        assert "missing system tools" in r.stderr and "sbatch" in r.stderr and "bwrap" in r.stderr
        assert "module load" in r.stderr and "apptainer" in r.stderr
        assert not (work / "apt-ran").exists()
    finally:
        shutil.rmtree(work)


@pytest.mark.integration
def test_ci_without_bubblewrap_fails_instead_of_skipping_the_sandbox_tests(tmp_path):
    bare = tmp_path / "bin"           # a PATH with no bwrap on it
    bare.mkdir()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_records.py"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PATH": str(bare), "CI": "true"})
    assert r.returncode == 1 and "bubblewrap is not installed" in r.stdout + r.stderr, r.stdout[-2000:]


def test_the_gpu_check_stops_at_once_where_there_is_no_gpu(tmp_path):
    """tools/gpu_check.sh on a GPU node runs the checks this machine cannot (docs/train.md); here it
    must end at once, saying why: no nvidia-smi, or (with one) a torch that sees no CUDA GPU."""
    import os
    import shutil
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    path_without_smi = ":".join(d for d in env["PATH"].split(":") if not os.path.exists(os.path.join(d, "nvidia-smi")))
    if shutil.which("nvidia-smi", path=path_without_smi) is None:
        r = subprocess.run(["bash", "tools/gpu_check.sh"], capture_output=True, text=True, timeout=30, cwd=ROOT,
                           env={**env, "PATH": path_without_smi})
        assert r.returncode == 2 and "no GPU on this machine (nvidia-smi is not on PATH)" in r.stderr, r.stderr
    import torch
    if torch.cuda.is_available():
        return
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'No devices were found'\n")
    smi.chmod(0o755)
    r = subprocess.run(["bash", "tools/gpu_check.sh"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**env, "PATH": f"{smi.parent}:{path_without_smi}", "PYTHON": sys.executable})
    assert r.returncode == 2 and "has no torch that sees a CUDA GPU" in r.stderr and "torch 2." in r.stderr, r.stderr
    assert "PASS" not in r.stdout
