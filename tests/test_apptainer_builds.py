"""A task's Dockerfile built with Apptainer (hpc/images/apptainer_def.py, apptainer_build.py), against a
stand-in `apptainer` (Apptainer is not installable here): the stand-in does what `apptainer build
--sandbox OUT DEF` documents, on a base rootfs named by the definition's From: copy the base, copy
%files in, run %post in a chroot of the result, write %environment. The image it leaves is then
graded in bwrap, with a grader that fails unless the Dockerfile's ENV, COPY and RUN all took.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_environment_builds import DOCKERFILE, assert_graded_in_bwrap, harbor_task

from hpc.images.apptainer_def import definition
from hpc.images.cache import ImageCache
from hpc.images.dockerfile import DockerfileError, plan_dockerfile
from hpc.images.hostroot import build_host_rootfs
from hpc.images.registries import mirror_reference

ROOT = Path(__file__).resolve().parents[1]
MIRROR = 'unqualified-search-registries = ["docker.io"]\n[[registry]]\nprefix = "docker.io/swebench"\n' \
         'location = "mirror.site.example:5000/hub/swebench"\ninsecure = true\n'

STANDIN = r'''#!/usr/bin/env python3
"""apptainer build [--fakeroot] [--nohttps] [--sandbox] OUT DEF, as its documentation says it works."""
import json, os, shutil, subprocess, sys, tarfile, tempfile
args = sys.argv[1:]
assert args[0] == "build", args
flags = [a for a in args[1:] if a.startswith("--")]
out, def_path = [a for a in args[1:] if not a.startswith("--")]
sections, name = {"header": []}, "header"
for line in open(def_path).read().splitlines():
    if line.startswith("%"):
        name = line[1:].strip()
        sections[name] = []
    else:
        sections[name].append(line)
header = dict(l.split(":", 1) for l in sections["header"] if ":" in l)
ref = header["From"].strip()
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(json.dumps({"args": args, "bootstrap": header["Bootstrap"].strip(), "from": ref}) + "\n")
bases = json.loads(os.environ["STANDIN_BASES"])
if ref not in bases:
    print(f"FATAL: While performing build: conveyor failed to get: {ref}: not found")
    sys.exit(255)
root = out if "--sandbox" in flags else tempfile.mkdtemp()
shutil.copytree(bases[ref], root, symlinks=True, dirs_exist_ok=True)
for line in sections.get("files", []):
    if line.strip():
        src, dest = line.split()
        shutil.copytree(src, root + dest, symlinks=True)
with open(os.path.join(root, ".post.sh"), "w") as f:
    f.write("\n".join(sections.get("post", [])) + "\n")
code = subprocess.run(["chroot", root, "/bin/sh", "-e", "/.post.sh"]).returncode
os.unlink(os.path.join(root, ".post.sh"))
if code:
    print(f"FATAL: While performing build: while running engine: exit status {code}")
    sys.exit(255)
os.makedirs(os.path.join(root, ".singularity.d/env"), exist_ok=True)
with open(os.path.join(root, ".singularity.d/env/90-environment.sh"), "w") as f:
    f.write("\n".join(sections.get("environment", [])) + "\n")
if "--sandbox" not in flags:
    with tarfile.open(out, "w") as t:       # not a real SIF: the tree, for what the test looks at
        t.add(root, arcname=".")
'''

pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                reason="needs bubblewrap (make sysdeps) and root (the stand-in's chroot, overlays)")]


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    work = tmp_path_factory.mktemp("apptainer")
    build_host_rootfs(work / "base", extra_bins=("curl", "tar"))
    (work / "bin").mkdir()
    (work / "bin" / "apptainer").write_text(STANDIN)
    (work / "bin" / "apptainer").chmod(0o755)
    (work / "registries.conf").write_text(MIRROR)
    mirrored = "mirror.site.example:5000/hub/swebench/sweb.eval.x86_64.demo__demo-1:latest"
    env = {**os.environ, "PATH": f"{work / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "STANDIN_LOG": str(work / "calls.jsonl"), "STANDIN_BASES": json.dumps({mirrored: str(work / "base")})}
    return work, env, mirrored


def images_build(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "images", "build", *map(str, args)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def test_a_dockerfile_built_by_apptainer_keeps_its_steps_in_order_and_its_env(standin, tmp_path):
    work, env, mirrored = standin
    task = harbor_task(tmp_path / "tasks" / "roman-apptainer", DOCKERFILE)
    cache = tmp_path / "cache"
    args = [task, "--cache", cache, "--builder", "apptainer", "--format", "rootfs",
            "--registries-conf", work / "registries.conf"]
    r = images_build(*args, env=env)
    assert r.returncode == 0 and "1 built, 0 cached, 0 failed" in r.stderr, r.stderr
    call = json.loads((work / "calls.jsonl").read_text().splitlines()[-1])
    assert call["args"][:3] == ["build", "--nohttps", "--sandbox"]   # the mirror is plain HTTP; a rootfs for bwrap
    assert (call["bootstrap"], call["from"]) == ("docker", mirrored)
    log = next((cache / "logs").glob("*.log")).read_text()
    steps = [line for line in log.splitlines() if line.startswith("STEP ")]
    assert [s.split(": ", 1)[1].split()[0] for s in steps] == ["WORKDIR", "ENV", "RUN", "COPY", "COPY", "RUN", "COPY",
                                                                    "USER"]
    (entry,) = ImageCache(cache).list("rootfs")
    assert entry.record.env["IMAGE_MARK"] == "from-the-dockerfile" and entry.record.user == "1000"
    assert entry.record.env["PATH"].startswith("/opt/tools/bin:/usr/local/sbin:")
    assert not (entry.payload / ".agentrl-context").exists()      # the staged context is gone from the image
    assert images_build(*args, env=env).stderr.count("0 built, 1 cached") == 1
    prompts = tmp_path / "prompts.jsonl"
    subprocess.run([sys.executable, "-m", "agentrl.cli", "convert", "harbor", str(task), "--out", str(prompts)],
                   check=True, capture_output=True, cwd=ROOT)
    assert_graded_in_bwrap(prompts, cache)


def test_a_failing_step_and_an_offline_download_are_named_as_with_buildah(standin, tmp_path):
    work, env, _ = standin
    failing = harbor_task(tmp_path / "tasks" / "fails", DOCKERFILE.replace("RUN /opt/setup.sh",
                                                                         "RUN exit 7 && /opt/setup.sh"))
    r = images_build(failing, "--cache", tmp_path / "cache", "--builder", "apptainer", "--format", "rootfs",
                     "--registries-conf", work / "registries.conf", env=env)
    assert r.returncode == 1 and "failed at step 7/9 (RUN exit 7 && /opt/setup.sh && echo" in r.stderr, r.stderr
    template = harbor_task(tmp_path / "tasks" / "swebench", "FROM swebench/sweb.eval.x86_64.demo__demo-1:latest\n"
                           "WORKDIR /testbed\nRUN curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\n")
    offline = {**env, "PATH": f"{tmp_path / 'offline'}{os.pathsep}{env['PATH']}"}
    (tmp_path / "offline").mkdir()
    (tmp_path / "offline" / "apptainer").write_text(
        f'#!/bin/sh\nexec unshare --net {work / "bin" / "apptainer"} "$@"\n')
    (tmp_path / "offline" / "apptainer").chmod(0o755)
    r = images_build(template, "--cache", tmp_path / "cache", "--builder", "apptainer", "--format", "rootfs",
                     "--registries-conf", work / "registries.conf", env=offline)
    assert r.returncode == 1, r.stderr
    assert "step 3/3 (RUN curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh): curl: (6) Could not resolve " \
           "host: astral.sh" in r.stderr and "exited 0" in r.stderr


def test_what_apptainer_cannot_replay_is_refused_naming_the_line():
    for text, says in [("FROM a AS b\nRUN x\nFROM c\nCOPY --from=b /x /x\n", "multi-stage"),
                       ("FROM a\nCOPY --chown=1:1 f /f\n", "COPY --chown is not replayed"),
                       ("FROM a\nUSER 1000\nRUN make\n", "line 3: RUN make: runs as USER 1000")]:
        with pytest.raises(DockerfileError, match=says):
            definition(plan_dockerfile(text, ["f"]), "/ctx")


def test_a_registries_conf_sends_a_short_name_to_its_mirror():
    assert mirror_reference("swebench/x:latest", MIRROR) == ("mirror.site.example:5000/hub/swebench/x:latest", True)
    assert mirror_reference("python:3.11", MIRROR) == ("docker.io/library/python:3.11", False)
    assert mirror_reference("quay.io/a/b:1", MIRROR) == ("quay.io/a/b:1", False)
    with_mirror = MIRROR + '[[registry.mirror]]\nlocation = "cache.site.example/hub"\n'
    assert mirror_reference("swebench/x:latest", with_mirror)[0] == "cache.site.example/hub/x:latest"


def test_a_base_pulled_to_the_shared_filesystem_is_bootstrapped_from_there(standin, tmp_path):
    from hpc.images.bases import base_layout

    work, env, _ = standin
    task = harbor_task(tmp_path / "tasks" / "from-layout", DOCKERFILE)
    cache = ImageCache(tmp_path / "cache")
    layout = base_layout(cache, "swebench/sweb.eval.x86_64.demo__demo-1:latest")
    layout.mkdir(parents=True)
    (layout / "index.json").write_text("{}")       # what the stand-in is given for it: the base rootfs
    env = {**env, "STANDIN_BASES": json.dumps({str(layout): str(work / "base")})}
    r = images_build(task, "--cache", cache.root, "--builder", "apptainer", "--format", "rootfs", env=env)
    assert r.returncode == 0, r.stderr
    call = json.loads((work / "calls.jsonl").read_text().splitlines()[-1])
    assert (call["bootstrap"], call["from"]) == ("oci", str(layout)) and "--nohttps" not in call["args"]
