import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ci import skip_or_fail, under_ci

from agentrl.swe.harbor import BUNDLED_TASKS

# Plugin modules that test modules also import helpers from: rewritten before that first import
pytest.register_assert_rewrite("oci_registry")

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_DIR = Path(os.environ.get("AGENTRL_CLUSTER_DIR",
                                  Path.home() / ".local/state/agentrl/local-cluster"))


def pytest_sessionstart(session):
    """Under CI every test this machine can run must run: without bubblewrap the sandbox tests would only
    skip, so CI fails at once instead, as it does when the local Slurm cluster is not up."""
    if under_ci() and shutil.which("bwrap") is None:
        pytest.exit("CI must run the sandbox tests: bubblewrap is not installed (make sysdeps)", returncode=1)


# A test's tier (setup.cfg's markers): unit unless it is marked with another; one that needs the Slurm
# cluster is a slurm test whether or not its module says so.
TIERS = ("integration", "slurm", "e2e")


def pytest_collection_modifyitems(items):
    for item in items:
        if "slurm_conf" in item.fixturenames and not item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.slurm)
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.unit)
    # `make test` runs the suite on pytest-xdist workers, a module's tests on one (--dist loadfile, so that
    # its module fixtures are made once) in this order: the modules with a slow test first, so that the last
    # to finish is not a long one drawn late.
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


# Side by side, two tests' jobs on the one local Slurm cluster compete for its three nodes and time each
# other out (CI after stop 36: a requeue and a resume test failed together, each passing alone and beside
# CPU load). So under xdist every module that uses the cluster (the slurm_env or slurm_conf fixture) is one
# unit of work, its modules run one after another on one worker, while the other takes the rest.
USES_CLUSTER = re.compile(r"\bslurm_(?:env|conf)\b")
CLUSTER_SCOPE = "the local Slurm cluster"


@functools.cache
def uses_cluster(module: str) -> bool:
    path = ROOT / module
    return path.suffix == ".py" and path.exists() and USES_CLUSTER.search(path.read_text()) is not None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ClusterScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return CLUSTER_SCOPE if uses_cluster(module) else module

    return ClusterScheduling(config, log)


@pytest.fixture(scope="session")
def bundled_prompts(tmp_path_factory) -> Path:
    """The eight bundled tasks (BUNDLED_TASKS) as prompt data, as `agentrl convert harbor` writes it."""
    import sys

    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    subprocess.run([sys.executable, "-m", "agentrl.cli", "convert", "harbor", str(BUNDLED_TASKS), "--out", str(path)],
                   check=True, capture_output=True, cwd=ROOT)
    return path


@pytest.fixture(scope="session")
def slurm_conf() -> Path:
    """The local cluster's slurm.conf. Skips (locally) or fails (under CI) when it is not up."""
    conf = CLUSTER_DIR / "etc" / "slurm.conf"
    problem = None
    if shutil.which("sinfo") is None:
        problem = "Slurm clients are not installed (make sysdeps)"
    elif not conf.exists():
        problem = f"the local Slurm cluster was never started ({conf} missing): run `agentrl cluster up`"
    else:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], env={**os.environ, "SLURM_CONF": str(conf)},
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            problem = f"the local Slurm cluster does not answer ({r.stderr.strip()}): run `agentrl cluster up`"
    if problem:
        skip_or_fail("the Slurm tests", problem)
    return conf


@pytest.fixture
def slurm_env(slurm_conf, monkeypatch) -> dict:
    monkeypatch.setenv("SLURM_CONF", str(slurm_conf))
    return {**os.environ, "SLURM_CONF": str(slurm_conf)}


@pytest.fixture
def cluster_shared(slurm_conf, tmp_path):
    """A fresh directory on the local cluster's shared filesystem, which this machine and each node mount
    as clients of their own (`agentrl cluster up --shared`, what `make cluster-up` runs). Skips (locally) or
    fails (under CI) where the cluster has none."""
    from hpc.localcluster import shared_path

    path = shared_path(CLUSTER_DIR)
    if path is None or not os.path.ismount(path):
        where = "" if path is None else f" ({path} is not mounted)"
        problem = f"the local Slurm cluster has no shared filesystem{where}: run `agentrl cluster up --shared`"
        skip_or_fail("the shared-filesystem tests", problem)
    where = path / f"{os.getpid()}-{tmp_path.name}"
    where.mkdir()
    yield where
    shutil.rmtree(where, ignore_errors=True)
