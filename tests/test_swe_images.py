"""Tasks whose image is not the host: built into the image cache, found by name, run in bwrap."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.swe.harbor import BUNDLED_TASKS
from agentrl.swe.sandboxes import resolve_image
from hpc.images.build import build_image
from hpc.images.cache import ImageCache
from hpc.images.hostroot import build_host_rootfs
from hpc.images.oci_writer import dir_entries, write_oci_layout
from hpc.sandbox.base import SandboxError

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (make sysdeps)")]


@pytest.fixture(scope="module")
def python_image(tmp_path_factory) -> Path:
    """An OCI layout of a small image with bash, git, Python and one task's repository (root's, as
    in a real image), made from the host's programs."""
    work = tmp_path_factory.mktemp("image")
    build_host_rootfs(work / "rootfs")
    shutil.copytree(BUNDLED_TASKS / "roman-subtractive/environment/repo", work / "rootfs/testbed", dirs_exist_ok=True)
    # Prove the sandbox runs the image, not the host: a marker only the image has.
    (work / "rootfs/etc/agentrl-image").write_text("from-the-image\n")
    write_oci_layout(work / "layout", [dir_entries(work / "rootfs")], compression=[None])
    return work / "layout"


def _task_with_image(src: str, image: str, dest: Path) -> Path:
    shutil.copytree(BUNDLED_TASKS / src, dest)
    toml = dest / "task.toml"
    toml.write_text(re.sub(r'docker_image = ".*"', f'docker_image = "{image}"', toml.read_text()))
    # The oracle also checks that it runs in the image.
    solve = dest / "solution/solve.sh"
    solve.write_text(solve.read_text().replace("set -euo pipefail\n",
                                               "set -euo pipefail\ngrep -q from-the-image /etc/agentrl-image\n", 1))
    return dest


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "check", *args, "--json"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_a_task_runs_in_its_built_image_found_in_the_cache_by_name(python_image, tmp_path):
    cache = tmp_path / "cache"
    task = _task_with_image("roman-subtractive", str(python_image), tmp_path / "in-image")

    before = _check(str(task), "--image-cache", str(cache))
    assert before.returncode == 1
    problem = json.loads(before.stdout.strip().splitlines()[-1])["tasks"][0]["problem"]
    assert f"agentrl images build {python_image} --cache {cache} --format rootfs" in problem

    entry, built = build_image(str(python_image), ImageCache(cache))
    assert built and entry.record.source == str(python_image)
    after = _check(str(task), "--image-cache", str(cache))
    row = json.loads(after.stdout.strip().splitlines()[-1])["tasks"][0]
    assert after.returncode == 0, row
    assert (row["oracle_reward"], row["noop_reward"]) == (1.0, 0.0)


def test_image_names_resolve_by_runtime(python_image, tmp_path):
    cache = ImageCache(tmp_path / "cache")
    assert resolve_image("host", "bwrap", cache) is None
    assert resolve_image("anything", "local", None) is None
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr").mkdir(parents=True)
    assert resolve_image(str(rootfs), "bwrap", None) == str(rootfs)
    sif = tmp_path / "x.sif"
    sif.write_bytes(b"")
    assert resolve_image(str(sif), "apptainer", None) == str(sif)
    with pytest.raises(SandboxError, match="needs the image cache: pass --image-cache"):
        resolve_image("python:3.11", "bwrap", None)
    with pytest.raises(SandboxError, match=r"not in the cache .* as sif: run `agentrl images build python:3.11"):
        resolve_image("python:3.11", "apptainer", cache)


def test_eval_finds_a_tasks_image_in_its_image_cache(python_image, tiny_model, tmp_path):
    """eval.pool.image_cache is honoured as pool.image_cache is: eval's attempts take the pool's path
    (agentrl.pool.claimed), image cache included. Without the cache every try is an infrastructure
    failure naming the command that builds the image."""
    cache = tmp_path / "cache"
    task = _task_with_image("roman-subtractive", str(python_image), tmp_path / "in-image")
    build_image(str(python_image), ImageCache(cache))

    def evaluate(pool: dict, out: Path) -> subprocess.CompletedProcess:
        config = tmp_path / f"{out.name}.yaml"
        config.write_text(json.dumps({"eval": {
            "tasks": str(task), "n_samples": 1, "max_tries": 1,
            "pool": {"harness": "builtin", "adapter": {"max_new_tokens": 16, "max_context": 4096}, "lease_s": 10,
                     "poll_s": 0.2, "tools_dir": str(tmp_path / "tools"), **pool}}}))
        return subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", str(tiny_model), "--config", str(config),
                               "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)

    r = evaluate({"image_cache": str(cache)}, tmp_path / "cached")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "cached/summary.json").read_text())
    assert (summary["attempts"], summary["infra_failures"]) == (1, 0), summary
    (result,) = [json.loads(line) for line in (tmp_path / "cached/results.jsonl").read_text().splitlines()]
    assert result["task"] == "in-image" and result["reward"] in (0.0, 1.0)

    r = evaluate({}, tmp_path / "uncached")
    summary = json.loads((tmp_path / "uncached/summary.json").read_text())
    assert (summary["attempts"], summary["infra_failures"]) == (0, 1), summary
    (fail,) = (tmp_path / "uncached/ledger").rglob("fails/*")
    assert "needs the image cache" in fail.read_text()
