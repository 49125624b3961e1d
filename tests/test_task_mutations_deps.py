"""A project whose tests need a third-party package: `agentrl tasks generate mutations --source DIR --with REQ`.

With real parts: the dependency is a wheel pip installs with --no-index from a --find-links directory
(made here, offline), the base image is the host's programs with pip, served by a loopback registry
as a site's mirror serves Docker Hub's python:3.11-slim, the image is built by buildah through
`agentrl images build`, and validation and grading run in it in bwrap. The project's suite fails
without the package (refused, naming --with); with it, validation waits for the image, then makes
tasks that share one build and grade oracle 1, no-op 0, and 0 for each known hack.
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

from agentrl.swe.mutate.project import SourceError
from agentrl.swe.mutate.requirements_image import RequirementsImage, check_requirement
from hpc.images.hostroot import build_host_rootfs

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["oci_registry"]
TOOLS = ("docker-registry", "buildah", "skopeo", "bwrap")
DEBIAN_PIP = Path("/usr/lib/python3/dist-packages/pip")      # python3-pip: the base image's pip
needs_tools = pytest.mark.skipif(
    any(shutil.which(t) is None for t in TOOLS) or os.geteuid() != 0 or not DEBIAN_PIP.is_dir(),
    reason=f"needs {', '.join(TOOLS)} and Debian's python3-pip (make sysdeps installs them) and root (buildah's "
           "chroot isolation, bwrap's overlay mounts)")

TALLY = {
    "tally/__init__.py": '''"""Counting and bounding numbers."""


def count_at_least(items, threshold):
    n = 0
    for x in items:
        if x >= threshold:
            n += 1
    return n


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def mean(xs):
    if not xs:
        raise ValueError("the mean of nothing")
    return sum(xs) / len(xs)


def spread(xs):
    return max(xs) - min(xs)
''',
    "tests/__init__.py": "",
    "tests/test_tally.py": '''import unittest

from tinycheck import check_equal      # a third-party package: not in the standard library

from tally import clamp, count_at_least, mean, spread


class TallyTest(unittest.TestCase):
    def test_count(self):
        check_equal(count_at_least([1, 2, 3, 4], 3), 2)

    def test_count_empty(self):
        check_equal(count_at_least([], 1), 0)

    def test_clamp_low(self):
        check_equal(clamp(-5, 0, 10), 0)

    def test_clamp_high(self):
        check_equal(clamp(50, 0, 10), 10)

    def test_clamp_inside(self):
        check_equal(clamp(5, 0, 10), 5)

    def test_mean(self):
        check_equal(mean([1, 2, 6]), 3)

    def test_mean_of_nothing(self):
        with self.assertRaises(ValueError):
            mean([])

    def test_spread(self):
        check_equal(spread([4, 9, 1]), 8)
''',
}


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def tinycheck_wheel(tmp: Path) -> Path:
    """tinycheck-1.0-py3-none-any.whl in a --find-links directory, built offline by pip."""
    src = write(tmp / "tinycheck-src", {
        "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
                          '[project]\nname = "tinycheck"\nversion = "1.0"\n',
        "tinycheck/__init__.py": 'def check_equal(a, b):\n    assert a == b, f"{a!r} != {b!r}"\n'})
    links = tmp / "links"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir",
                    str(links), str(src)], check=True, capture_output=True)
    return links


def own_wheel(project: Path, links: Path) -> None:
    """The project itself as a wheel in the --find-links directory: installed in the image by --with, its files
    are the unmutated code, the answer to every task (the generator uninstalls it; --leaks looks)."""
    src = project.parent / f"{project.name}-wheel-src"
    shutil.copytree(project / project.name, src / project.name)
    (src / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                                        '"setuptools.build_meta"\n\n[project]\nname = "tally"\nversion = "1.0"\n\n'
                                        '[tool.setuptools]\npackages = ["tally"]\n')
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir",
                    str(links), str(src)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def mirror(registry, tmp_path_factory):
    """The site's mirror of Docker Hub's python image (the default --base-image): the host's programs with
    Debian's pip, pushed to the loopback registry; the registries.conf that sends docker.io's python there."""
    base = tmp_path_factory.mktemp("base")
    build_host_rootfs(base / "rootfs")
    shutil.copytree(DEBIAN_PIP, base / "rootfs/usr/lib/python3/dist-packages/pip")
    push_rootfs(base / "rootfs", base / "layout", f"{registry}/library/python:3.11-slim")
    return registries_conf(base / "registries.conf", "docker.io/library/python", f"{registry}/library/python")


def agentrl(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_a_with_requirement_is_plain_and_its_image_is_named_by_its_content():
    assert check_requirement(" hypothesis==6.* ") == "hypothesis==6.*"
    for bad in ("--index-url=http://x", "https://x/y.whl", "./wheel.whl", "pkg'; rm -rf /", ""):
        with pytest.raises(SourceError, match="--with"):
            check_requirement(bad)
    a = RequirementsImage(("tinycheck",), "python:3.11-slim", {"tinycheck-1.0-py3-none-any.whl": b"PK"})
    assert a.image == RequirementsImage(("tinycheck",), "python:3.11-slim", dict(a.wheels)).image
    assert a.image != RequirementsImage(("tinycheck",), "python:3.12-slim", dict(a.wheels)).image
    other_wheel = {"tinycheck-1.0-py3-none-any.whl": b"PK2"}
    assert a.image != RequirementsImage(("tinycheck",), "python:3.11-slim", other_wheel).image
    assert "pip install --no-index" in a.dockerfile() and a.dockerfile().startswith("FROM python:3.11-slim\n")


def _wheel(*names: str) -> bytes:
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n in names:
            z.writestr(n, "x = 1\n")
    return buf.getvalue()


def test_a_wheel_that_installs_the_projects_own_modules_is_uninstalled_in_its_image():
    from agentrl.swe.mutate.project import Project
    from agentrl.swe.mutate.requirements_image import shadowing

    wheels = {"tally-1.0-py3-none-any.whl": _wheel("tally/__init__.py", "tally-1.0.dist-info/RECORD"),
              "tinycheck-1.0-py3-none-any.whl": _wheel("tinycheck/__init__.py", "tinycheck-1.0.dist-info/RECORD"),
              "one-2.0-py3-none-any.whl": _wheel("one.py", "one-2.0.dist-info/RECORD")}
    flat = Project("tally", {"tally/__init__.py": b"x = 1\n", "tests/test_tally.py": b"y = 1\n"})
    src = Project("tally", {"src/tally/__init__.py": b"x = 1\n", "src/one.py": b"x = 1\n"})
    assert shadowing(wheels, flat) == ("tally",)
    assert shadowing(wheels, src) == ("one", "tally")
    env = RequirementsImage(("tinycheck", "tally"), "python:3.11-slim", wheels, shadowing(wheels, flat))
    install, uninstall = env.dockerfile().split(" && rm -rf /tmp/agentrl-wheels")
    assert "pip install" in install and "pip uninstall -y --disable-pip-version-check 'tally'" in uninstall
    assert "tinycheck" not in uninstall
    assert RequirementsImage(("tinycheck",), "python:3.11-slim", wheels).key != env.key     # another image


def test_with_before_any_source_and_a_base_without_with_are_refused(tmp_path):
    out = tmp_path / "out"
    r = agentrl("tasks", "generate", "mutations", "--with", "pytest", "--source", tmp_path, "--n", "1",
                "--split", "train", "--out", out)
    assert r.returncode == 2 and "give it after the --source" in r.stderr, r.stderr
    r = agentrl("tasks", "generate", "mutations", "--source", tmp_path, "--base-image", "python:3.12", "--n", "1",
                "--split", "train", "--out", out)
    assert r.returncode == 2 and "--base-image is the image of a source with --with" in r.stderr, r.stderr
    r = agentrl("tasks", "generate", "mutations", "--source", tmp_path, "--with", "pytest", "--n", "1",
                "--split", "train", "--out", out)
    assert r.returncode == 2 and "--with needs --image-cache" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.integration
@needs_tools
def test_tasks_of_a_project_with_a_test_dependency_share_one_image_and_grade_in_it(mirror, tmp_path):
    project = write(tmp_path / "tally", TALLY)
    links = tinycheck_wheel(tmp_path)
    out, cache = tmp_path / "tasks", tmp_path / "cache"
    generate = ("tasks", "generate", "mutations", "--source", project)
    common = ("--n", "3", "--seed", "0", "--split", "train", "--out", out)

    # Without the package its suite cannot run: refused, and told what to add
    bare = agentrl(*generate, *common)
    assert bare.returncode == 1 and "no test passes on the clean tree" in bare.stderr, bare.stderr
    assert "tinycheck" in bare.stderr and "--with it after the --source" in bare.stderr

    # With it: the image is not built yet, so nothing is validated and the command to build it is given. The
    # project itself is installed too (from its own wheel), as a source's test tools sometimes pull it in.
    own_wheel(project, links)
    deps = ("--with", "tinycheck", "--with", "tally", "--find-links", links, "--image-cache", cache)
    first = agentrl(*generate, *deps, *common)
    environments = out / ".mutations" / "environments.jsonl"
    assert first.returncode == 1 and f"agentrl images build {environments} --cache {cache}" in first.stderr, \
        first.stderr
    assert len(list((out / ".mutations").glob("tally-*/clean.json"))) == 1        # the run without it

    storage = ("--registries-conf", mirror, "--storage-root", tmp_path / "buildah", "--storage-driver", "vfs")
    built = agentrl("images", "build", environments, "--cache", cache, *storage)
    assert built.returncode == 0 and "1 built, 0 cached, 0 failed" in built.stderr, built.stderr[-3000:]

    made = agentrl(*generate, *deps, *common)
    assert made.returncode == 0, made.stderr[-3000:]
    tasks = sorted(p for p in out.iterdir() if not p.name.startswith("."))
    assert len(tasks) == 3
    for t in tasks:
        env = t / "environment"
        assert sorted(p.relative_to(env).as_posix() for p in env.rglob("*") if p.is_file() and "repo" not in p.parts) \
            == ["Dockerfile", "wheels/tally-1.0-py3-none-any.whl", "wheels/tinycheck-1.0-py3-none-any.whl"]
        assert "pip uninstall -y --disable-pip-version-check 'tally'" in (env / "Dockerfile").read_text()
        assert (env / "repo" / "tally" / "__init__.py").is_file()
        assert 'testbed = "repo"' in (t / "task.toml").read_text()
    results = {p: p.stat().st_mtime_ns for p in (out / ".mutations").rglob("*.json")}
    again = agentrl(*generate, *deps, *common)          # resumable: every result is there, nothing runs again
    assert again.returncode == 0 and re.search(r"tally: built \d+, kept \d+ \(3 wanted\)", again.stderr), again.stderr
    assert {p: p.stat().st_mtime_ns for p in (out / ".mutations").rglob("*.json")} == results

    prompts = tmp_path / "prompts.jsonl"
    converted = agentrl("convert", "harbor", out, "--out", prompts)
    assert converted.returncode == 0, converted.stderr
    records = [json.loads(line) for line in prompts.read_text().splitlines()]
    assert len({r["metadata"]["image"] for r in records}) == 1            # one image for the project's tasks
    assert all(r["metadata"]["harbor"]["testbed_files"] for r in records)
    shared = agentrl("images", "build", out, "--cache", cache, *storage)
    assert shared.returncode == 0 and "0 built, 1 cached, 0 failed" in shared.stderr, shared.stderr[-2000:]

    check = agentrl("tasks", "check", prompts, "--runtime", "bwrap", "--image-cache", cache, "--json")
    rows = json.loads(check.stdout.strip().splitlines()[-1])["tasks"]
    assert check.returncode == 0, (rows, check.stderr[-2000:])
    assert [(r["oracle_reward"], r["noop_reward"]) for r in rows] == [(1.0, 0.0)] * 3
    hacks = agentrl("tasks", "check", tasks[0], "--hacks-only", "--leaks", "--runtime", "bwrap", "--image-cache",
                    cache, "--json")
    assert hacks.returncode == 0, hacks.stdout[-2000:] + hacks.stderr[-2000:]
    result = json.loads(hacks.stdout.strip().splitlines()[-1])
    runs = result["hacks"]
    assert len(runs) >= 20 and all(r["reward"] == 0 and not r["problem"] for r in runs), runs   # each hack, both modes
    # no copy of the project in the image's site-packages, nor anywhere else the agent can read
    assert [(r["leaks"], r["problem"]) for r in result["leaks"]] == [([], "")]


NUMFMT = {
    "numfmt/__init__.py": '''"""Numbers as text."""


def pad(s, width, fill=" "):
    if len(s) >= width:
        return s
    return fill * (width - len(s)) + s


def thousands(n):
    s = str(abs(n))
    groups = []
    while len(s) > 3:
        groups.insert(0, s[-3:])
        s = s[:-3]
    groups.insert(0, s)
    return ("-" if n < 0 else "") + ",".join(groups)
''',
    "tests/conftest.py": '''import pytest


@pytest.fixture
def zero():
    return "0"
''',
    "tests/test_numfmt.py": '''import pytest

from numfmt import pad, thousands


def test_pad():
    assert pad("7", 3) == "  7"


def test_pad_wide():
    assert pad("1234", 3) == "1234"


def test_pad_fill(zero):           # a fixture of the suite's conftest.py
    assert pad("7", 3, zero) == "007"


@pytest.mark.parametrize("n, want", [(1, "1"), (999, "999"), (1234, "1,234"), (-1234567, "-1,234,567")])
def test_thousands(n, want):
    assert thousands(n) == want
''',
}


@pytest.mark.slow
@pytest.mark.integration
@needs_tools
def test_a_pytest_suite_with_pytest_from_the_index_validates_and_grades_by_node_id(mirror, tmp_path):
    """Plain test functions, a conftest.py fixture and parametrized tests: `--with pytest` runs them with pytest
    (the version this environment has, its wheels from the index), in validation and in grading alike; a
    pytest plugin the agent names in the repository's configuration or conftest.py earns nothing."""
    project = write(tmp_path / "numfmt", NUMFMT)
    out, cache = tmp_path / "tasks", tmp_path / "cache"
    args = ("tasks", "generate", "mutations", "--source", project, "--with", f"pytest=={pytest.__version__}",
            "--image-cache", cache, "--n", "2", "--seed", "0", "--split", "train", "--out", out)
    first = agentrl(*args)
    assert first.returncode == 1 and "agentrl images build" in first.stderr, first.stderr[-2000:]
    storage = ("--registries-conf", mirror, "--storage-root", tmp_path / "buildah", "--storage-driver", "vfs")
    built = agentrl("images", "build", out / ".mutations" / "environments.jsonl", "--cache", cache, *storage)
    assert built.returncode == 0 and "1 built" in built.stderr, built.stderr[-3000:]
    made = agentrl(*args)
    assert made.returncode == 0, made.stderr[-3000:]
    tasks = sorted(p for p in out.iterdir() if not p.name.startswith("."))
    assert len(tasks) == 2
    for t in tasks:
        expected = json.loads((t / "tests" / "expected.json").read_text())
        assert expected["runner"] == "pytest"
        named = expected["FAIL_TO_PASS"] + expected["PASS_TO_PASS"]
        assert all(n.startswith("tests/test_numfmt.py::test_") for n in named)
        assert "tests/test_numfmt.py::test_thousands[1234-1,234]" in named
        instruction = (t / "instruction.md").read_text()
        assert f"`python3 -m pytest {expected['FAIL_TO_PASS'][0]}` says:" in instruction
        assert "Traceback" in instruction and "numfmt/__init__.py" not in instruction, instruction

    check = agentrl("tasks", "check", out, "--runtime", "bwrap", "--image-cache", cache, "--hacks", "--json")
    report = json.loads(check.stdout.strip().splitlines()[-1])
    assert check.returncode == 0, (report, check.stderr[-2000:])
    assert [(r["oracle_reward"], r["noop_reward"]) for r in report["tasks"]] == [(1.0, 0.0)] * 2
    assert {r["hack"] for r in report["hacks"]} >= {"pytest-forced-pass", "tests-forced-pass", "tests-uncollected"}
    assert all(r["reward"] == 0 and not r["problem"] for r in report["hacks"]), report["hacks"]
