"""A Harbor task whose Dockerfile needs a build, end to end with real parts: a loopback OCI registry
(Debian's docker-registry) standing in for Docker Hub behind a site mirror config, a base image
made offline from the host's programs, buildah, the image cache, and grading in bwrap.

The Dockerfile's `FROM swebench/...:latest` is left as Harbor's SWE-bench tasks write it and
resolves through the registries.conf; the image's ENV must reach the grader.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from oci_registry import push_rootfs, registries_conf

from agentrl.swe.harbor import BUNDLED_TASKS, convert_task
from agentrl.swe.task_images import environment_builds
from hpc.images.cache import ImageCache
from hpc.images.hostroot import build_host_rootfs

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["oci_registry"]     # the loopback registry
BASE = "swebench/sweb.eval.x86_64.demo__demo-1:latest"
TOOLS = ("docker-registry", "buildah", "skopeo", "bwrap")
pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    any(shutil.which(t) is None for t in TOOLS) or os.geteuid() != 0,
    reason=f"needs {', '.join(TOOLS)} (make sysdeps installs them) and root (buildah's chroot isolation, "
           "bwrap's overlay mounts)")]


@pytest.fixture(scope="module")
def mirror(registry, tmp_path_factory):
    """Docker Hub's swebench/ images served by the loopback registry, as a site's mirror serves them:
    the base (the host's programs, curl among them) is pushed there, and a registries.conf says where."""
    work = tmp_path_factory.mktemp("base")
    build_host_rootfs(work / "rootfs", extra_bins=("curl",))
    push_rootfs(work / "rootfs", work / "layout", f"{registry}/{BASE}")
    return registries_conf(work / "registries.conf", "docker.io/swebench", f"{registry}/swebench")


DOCKERFILE = f"""FROM {BASE}
WORKDIR /testbed
ENV IMAGE_MARK=from-the-dockerfile PATH="/opt/tools/bin:$PATH"
RUN mkdir -p /logs /opt/tools/bin && printf '#!/bin/sh\\necho hello\\n' > /opt/tools/bin/greet \\
    && chmod +x /opt/tools/bin/greet
COPY repo/ /testbed/
COPY setup.sh /opt/setup.sh
RUN /opt/setup.sh && echo from-the-run > /opt/order
COPY order /opt/order
USER 1000
"""


def harbor_task(dest: Path, dockerfile: str) -> Path:
    """roman-subtractive with its repository in an image built from a Dockerfile, and a grader that
    fails unless the image's ENV reached it."""
    shutil.copytree(BUNDLED_TASKS / "roman-subtractive", dest)
    toml = dest / "task.toml"
    toml.write_text(toml.read_text().replace('docker_image = "host"\nworkdir = "/testbed"\n', ""))
    (dest / "environment" / "Dockerfile").write_text(dockerfile)
    (dest / "environment" / "setup.sh").write_text("#!/bin/sh\nset -e\ntouch /opt/setup-ran\n")
    (dest / "environment" / "setup.sh").chmod(0o755)
    (dest / "environment" / "order").write_text("from-the-copy\n")     # a COPY after a RUN wins, in order
    test_sh = dest / "tests" / "test.sh"
    test_sh.write_text(test_sh.read_text().replace(
        'cd "$TESTBED" || exit 2\n',
        'cd "$TESTBED" || exit 2\n[ "$IMAGE_MARK" = from-the-dockerfile ] && [ "$(greet)" = hello ] '
        '&& [ -e /opt/setup-ran ] && [ "$(cat /opt/order)" = from-the-copy ] || exit 3\n', 1))
    return dest


def images_build(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "images", "build", *map(str, args)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def test_a_harbor_dockerfile_is_built_through_a_mirror_and_graded_in_bwrap(mirror, tmp_path):
    task = harbor_task(tmp_path / "tasks" / "roman-in-image", DOCKERFILE)
    prompts = tmp_path / "prompts.jsonl"
    subprocess.run([sys.executable, "-m", "agentrl.cli", "convert", "harbor", str(task.parent), "--out", str(prompts)],
                   check=True, capture_output=True, cwd=ROOT)
    record = json.loads(prompts.read_text())
    (build,) = environment_builds([record]).values()
    assert record["metadata"]["image"] == f"dockerfile:{build.key}" and record["metadata"]["workdir"] == "/testbed"
    assert build.executable == {"setup.sh"}

    cache = tmp_path / "cache"
    storage = ["--registries-conf", mirror, "--storage-root", tmp_path / "buildah", "--storage-driver", "vfs"]
    first = images_build(prompts, "--cache", cache, *storage)
    assert first.returncode == 0, first.stderr
    assert "1 built, 0 cached, 0 failed" in first.stderr
    again = images_build(task.parent, "--cache", cache, *storage)       # the task directory names the same build
    assert again.returncode == 0 and "0 built, 1 cached, 0 failed" in again.stderr, again.stderr

    entry = ImageCache(cache).find(f"dockerfile:{build.key}", "rootfs")
    assert entry is not None and entry.record.user == "1000" and entry.record.workdir == "/testbed"
    assert entry.record.env["IMAGE_MARK"] == "from-the-dockerfile"
    assert entry.record.env["PATH"].startswith("/opt/tools/bin:")

    assert_graded_in_bwrap(prompts, cache)

    # The same image stored as layers (the base's once, whichever images share it), stacked by the sandbox
    layered = images_build(prompts, "--cache", cache, "--format", "layers", *storage)
    assert layered.returncode == 0 and "1 built" in layered.stderr, layered.stderr
    stack = ImageCache(cache).find(f"dockerfile:{build.key}", "layers")
    assert len(ImageCache(cache).layer_dirs(stack)) == 2      # the base's, and the build's (buildah commits one)
    shutil.rmtree(entry.path)                                 # the flattened rootfs cannot be what runs
    assert_graded_in_bwrap(prompts, cache)


def assert_graded_in_bwrap(prompts: Path, cache: Path) -> None:
    check = subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "check", str(prompts), "--runtime",
                            "bwrap", "--image-cache", str(cache), "--json"],
                           capture_output=True, text=True, timeout=600, cwd=ROOT)
    row = json.loads(check.stdout.strip().splitlines()[-1])["tasks"][0]
    assert check.returncode == 0, (row, check.stderr[-2000:])
    assert (row["oracle_reward"], row["noop_reward"]) == (1.0, 0.0)


def test_a_download_that_cannot_reach_the_network_fails_the_build_though_its_step_exits_0(mirror, tmp_path):
    """Harbor's SWE-bench template, verbatim, built on a node without network: `curl | sh` exits with sh's
    status, 0, and the image would lack uv; the build must fail, naming the step and what curl said."""
    template = (f"FROM {BASE}\nWORKDIR /testbed\nRUN curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\n"
                "RUN mkdir -p /logs\n")
    task = harbor_task(tmp_path / "tasks" / "swebench-template", template)
    storage = ["--registries-conf", mirror, "--storage-root", tmp_path / "buildah", "--storage-driver", "vfs"]
    # The base comes from the mirror first (a login node's job); then the build runs without a network.
    subprocess.run(["buildah", "--root", tmp_path / "buildah", "--runroot", tmp_path / "buildah" / "run",
                    "--storage-driver", "vfs", "pull", BASE], check=True, capture_output=True,
                   env={**os.environ, "CONTAINERS_REGISTRIES_CONF": str(mirror)})
    offline = tmp_path / "offline-bin"
    offline.mkdir()
    (offline / "buildah").write_text(f'#!/bin/sh\nexec unshare --net {shutil.which("buildah")} "$@"\n')
    (offline / "buildah").chmod(0o755)
    r = images_build(task, "--cache", tmp_path / "cache", *storage,
                     env={**os.environ, "PATH": f"{offline}{os.pathsep}{os.environ['PATH']}"})
    assert r.returncode == 1 and "0 built, 0 cached, 1 failed" in r.stderr, r.stderr
    assert re.search(r"step 3/4 \(RUN curl -LsSf https://astral.sh/uv/0.7.13/install.sh \| sh\): curl: \(\d+\) "
                     r"Could not resolve host: astral.sh", r.stderr), r.stderr
    assert "exited 0" in r.stderr and "build on a node with network access" in r.stderr
    assert not list((tmp_path / "cache").glob("rootfs/sha256-*")), "a build that lacks its download is never cached"
    log = re.search(r"Log: (\S+\.log)", r.stderr).group(1)
    assert "Could not resolve host" in Path(log).read_text()


def test_the_build_context_of_a_record_is_checked_against_its_key(tmp_path):
    record = convert_task(harbor_task(tmp_path / "t", DOCKERFILE))
    (build,) = environment_builds([record]).values()
    forged = json.loads(json.dumps(record))
    forged["metadata"]["harbor"]["environment_build"]["executable"] = []   # same files, another build
    with pytest.raises(ValueError, match="is not the content's"):
        environment_builds([forged])
    escape = json.loads(json.dumps(record))
    files = escape["metadata"]["harbor"]["environment_build"]["files"]
    files["../../etc/cron.d/x"] = files.pop("setup.sh")
    with pytest.raises(ValueError, match="has a '..' component"):
        environment_builds([escape])


@pytest.mark.slurm
def test_a_data_set_builds_as_a_slurm_array_that_resumes_and_names_what_failed(mirror, tmp_path, slurm_env):
    """Three tasks, two environments (two tasks share one Dockerfile) and one that cannot build: the
    array builds each environment once; submitted again, it builds nothing that is cached."""
    tasks = tmp_path / "tasks"
    harbor_task(tasks / "a", DOCKERFILE)
    harbor_task(tasks / "b", DOCKERFILE)                       # the same context: the same build
    harbor_task(tasks / "c", DOCKERFILE.replace("RUN /opt/setup.sh", "RUN exit 7 && /opt/setup.sh"))
    cache = tmp_path / "cache"
    args = [tasks, "--cache", cache, "--registries-conf", mirror, "--storage-root", tmp_path / "buildah",
            "--storage-driver", "vfs", "--slurm", "--parallelism", "2"]
    env = {**slurm_env, "AGENTRL_PYTHON": sys.executable}
    r = images_build(*args, env=env)
    assert r.returncode == 1, r.stderr
    assert "0 of 2 builds are cached already" in r.stderr and "1 built, 0 cached, 1 failed, 0 remaining" in r.stderr
    failed = re.search(r"FAILED dockerfile:\w+ \(task c\): (.*)", r.stderr)
    assert failed, r.stderr
    assert failed.group(1).startswith(
        "building the environment of task c (environment/Dockerfile) failed at step 7/9 (RUN exit 7 && "
        "/opt/setup.sh && echo from-the-run > /opt/order) (exit 7)"), r.stderr
    log = re.search(r"see (\S+\.log)", failed.group(1)).group(1)
    assert "exit status 7" in Path(log).read_text()
    # Submitted again: the built one is not submitted, the failed one is tried again (and fails again)
    again = images_build(*args, env=env)
    assert "1 of 2 builds are cached already" in again.stderr and "0 built, 0 cached, 1 failed" in again.stderr
    (build_a, build_c) = environment_builds([convert_task(tasks / "a"), convert_task(tasks / "c")]).values()
    assert ImageCache(cache).find(f"dockerfile:{build_a.key}", "rootfs") is not None
    assert ImageCache(cache).find(f"dockerfile:{build_c.key}", "rootfs") is None


def charliecloud_missing() -> str | None:
    from hpc.images.charliecloud import ch_image_command

    if shutil.which("ch-image") is None:
        return "charliecloud is not installed (make sysdeps installs it)"
    r = subprocess.run([*ch_image_command(), "--version"], capture_output=True, text=True,
                       env={**os.environ, "USER": "root"})
    return None if r.returncode == 0 else f"ch-image does not run: {r.stderr.strip()[-200:]}"


@pytest.mark.skipif(charliecloud_missing() is not None, reason=str(charliecloud_missing()))
def test_charliecloud_builds_the_dockerfile_from_a_base_pulled_through_the_mirror(mirror, tmp_path):
    task = harbor_task(tmp_path / "tasks" / "roman-ch", DOCKERFILE)
    cache = tmp_path / "cache"
    args = [task, "--cache", cache, "--builder", "charliecloud", "--registries-conf", mirror,
            "--storage-root", tmp_path / "ch"]
    r = images_build(*args)
    assert r.returncode == 0 and "1 built, 0 cached, 0 failed" in r.stderr, r.stderr
    entries = {e.record.source: e for e in ImageCache(cache).list("rootfs")}
    assert BASE in entries                   # the base came through skopeo and the mirror, into the cache too
    (build,) = environment_builds([convert_task(task)]).values()
    built = entries[f"dockerfile:{build.key}"]
    assert built.record.env["IMAGE_MARK"] == "from-the-dockerfile" and built.record.workdir == "/testbed"
    assert built.record.user is None         # charliecloud ignores USER, and says so
    prompts = tmp_path / "prompts.jsonl"
    subprocess.run([sys.executable, "-m", "agentrl.cli", "convert", "harbor", str(task), "--out", str(prompts)],
                   check=True, capture_output=True, cwd=ROOT)
    assert_graded_in_bwrap(prompts, cache)
    assert "0 built, 1 cached" in images_build(*args).stderr


def test_a_build_check_from_the_task_refuses_an_image_that_lacks_what_it_must_hold(mirror, tmp_path):
    """`RUN curl ... | sh` that fetched nothing still exits 0; [environment] build_check is the task's
    own word on what its image must hold, run in the image before the cache takes it."""
    storage = ["--registries-conf", mirror, "--storage-root", tmp_path / "buildah", "--storage-driver", "vfs"]
    for name, check, ok in (("holds", "test -e /opt/setup-ran && greet", True),
                            ("lacks", "test -x /root/.local/bin/uv", False)):
        task = harbor_task(tmp_path / "tasks" / name, DOCKERFILE)
        toml = task / "task.toml"
        toml.write_text(toml.read_text().replace("[environment]\n", f"[environment]\nbuild_check = '{check}'\n"))
        for fmt in ("rootfs", "layers"):
            r = images_build(task, "--cache", tmp_path / f"cache-{name}-{fmt}", "--format", fmt, *storage)
            assert (r.returncode == 0) == ok, r.stderr
            if not ok:
                assert "the image's check `test -x /root/.local/bin/uv` (task.toml [environment] build_check) " \
                       "failed (exit 1)" in r.stderr and "the image is not cached" in r.stderr, r.stderr
                assert not list((tmp_path / f"cache-{name}-{fmt}").glob(f"{fmt}/sha256-*"))


def offline_path(tmp_path: Path, *tools: str) -> dict:
    """An environment whose `tools` run in a network namespace of their own: a node without network."""
    bin_dir = tmp_path / "offline-bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in tools:
        (bin_dir / tool).write_text(f'#!/bin/sh\nexec unshare --net {shutil.which(tool)} "$@"\n')
        (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_bases_pulled_on_a_node_with_network_build_on_nodes_without_it(mirror, tmp_path):
    task = harbor_task(tmp_path / "tasks" / "offline", DOCKERFILE)
    cache = tmp_path / "cache"
    pulled = images_build(task, "--cache", cache, "--registries-conf", mirror, "--pull-bases")
    assert pulled.returncode == 0 and f"{BASE}: pulled" in pulled.stderr, pulled.stderr
    again = images_build(task, "--cache", cache, "--registries-conf", mirror, "--pull-bases")
    assert f"{BASE}: present" in again.stderr and "1 of 1 bases" in again.stderr
    offline = offline_path(tmp_path, "buildah", "skopeo")
    for builder, extra in (("buildah", ["--storage-driver", "vfs", "--storage-root", tmp_path / "fresh-buildah"]),
                           ("charliecloud", ["--storage-root", tmp_path / "fresh-ch"])):
        if builder == "charliecloud" and charliecloud_missing():
            continue
        built = images_build(task, "--cache", tmp_path / f"cache-{builder}", "--registries-conf", mirror,
                             "--builder", builder, *extra, env=offline)
        assert built.returncode != 0       # without the pulled bases (another cache) there is nothing to build on
        shutil.copytree(cache / "bases", tmp_path / f"cache-{builder}" / "bases")
        built = images_build(task, "--cache", tmp_path / f"cache-{builder}", "--registries-conf", mirror,
                             "--builder", builder, *extra, env=offline)
        assert built.returncode == 0 and "1 built" in built.stderr, (builder, built.stderr)
