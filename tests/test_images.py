"""hpc.images: reading OCI layouts and docker-archives, safe layer extraction, the image cache,
SIF and pull command lines, and the Slurm array script."""

from __future__ import annotations

import dataclasses
import io
import json
import multiprocessing
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc.images import build as build_mod
from hpc.images.array import JobOutcome, array_script, watch, write_outcome
from hpc.images.build import (
    apptainer_build_command,
    apptainer_uri,
    build_image,
    skopeo_copy_command,
)
from hpc.images.cache import ImageCache
from hpc.images.extract import extract_image, extract_layer
from hpc.images.oci import ImageError, open_image
from hpc.images.oci_writer import E, dir_entries, write_docker_archive, write_oci_layout, write_tar_of_dir

ROOT = Path(__file__).resolve().parents[1]


def _layers(tmp: Path) -> list[list[E]]:
    """Three layers: files, modes, links; whiteouts and an opaque dir; more whiteouts and a replacement."""
    l1 = tmp / "l1"
    (l1 / "etc").mkdir(parents=True)
    (l1 / "etc/passwd").write_text("root:x:0:0\n")
    (l1 / "etc/remove-me").write_text("gone\n")
    (l1 / "opt/app/sub").mkdir(parents=True)
    (l1 / "opt/app/old.txt").write_text("old\n")
    (l1 / "opt/app/sub/deep.txt").write_text("deep\n")
    (l1 / "bin").mkdir()
    (l1 / "bin/tool").write_text("#!/bin/sh\necho tool\n")
    (l1 / "bin/tool").chmod(0o755)
    os.link(l1 / "bin/tool", l1 / "bin/tool-hard")
    os.symlink("tool", l1 / "bin/sh-link")
    (l1 / "usr/share/ro").mkdir(parents=True)
    (l1 / "usr/share/ro/readme").write_text("ro\n")
    (l1 / "usr/share/ro").chmod(0o555)
    l2 = tmp / "l2"
    (l2 / "etc").mkdir(parents=True)
    (l2 / "etc/.wh.remove-me").write_text("")
    (l2 / "etc/passwd").write_text("root:x:0:0\nagent:x:1000:1000\n")
    (l2 / "opt/app/sub").mkdir(parents=True)
    (l2 / "opt/app/.wh..wh..opq").write_text("")
    (l2 / "opt/app/new.txt").write_text("new\n")
    (l2 / "opt/app/sub/fresh.txt").write_text("fresh\n")
    try:
        layers = [dir_entries(l1), dir_entries(l2)]
    finally:
        (l1 / "usr/share/ro").chmod(0o755)
    layers.append([E("bin/.wh.sh-link"), E("bin/sh", "symlink", target="/bin/tool"),
                   E("etc/passwd", "dir", mode=0o700),  # a directory replaces a file
                   E("var/log/app.log", data=b"log\n", mode=0o600),  # parents not listed
                   E("dev/null", "chr"), E("run/fifo", "fifo", mode=0o600)])
    return layers


EXPECTED = {
    "bin": ("d", 0o755), "bin/tool": ("f", 0o755, b"#!/bin/sh\necho tool\n"),
    "bin/tool-hard": ("f", 0o755, b"#!/bin/sh\necho tool\n"), "bin/sh": ("l", "/bin/tool"),
    "etc": ("d", 0o755), "etc/passwd": ("d", 0o700),
    "opt": ("d", 0o755), "opt/app": ("d", 0o755), "opt/app/new.txt": ("f", 0o644, b"new\n"),
    "opt/app/sub": ("d", 0o755), "opt/app/sub/fresh.txt": ("f", 0o644, b"fresh\n"),
    "usr": ("d", 0o755), "usr/share": ("d", 0o755), "usr/share/ro": ("d", 0o555),
    "usr/share/ro/readme": ("f", 0o644, b"ro\n"),
    "var": ("d", 0o755), "var/log": ("d", 0o755), "var/log/app.log": ("f", 0o600, b"log\n"),
    "dev": ("d", 0o755), "run": ("d", 0o755), "run/fifo": ("p", 0o600),
}


def snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel, mode = p.relative_to(root).as_posix(), stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", mode)
            elif stat.S_ISFIFO(st.st_mode):
                out[rel] = ("p", mode)
            else:
                out[rel] = ("f", mode, p.read_bytes())
    return out


@pytest.fixture
def layers(tmp_path):
    old = os.umask(0o022)
    try:
        yield _layers(tmp_path / "src")
    finally:
        os.umask(old)


def _source(kind: str, layers, tmp: Path) -> Path:
    if kind == "oci-layout":
        write_oci_layout(tmp / "layout", layers, ["gzip", "gzip", None])
        return tmp / "layout"
    if kind == "oci-archive":
        write_oci_layout(tmp / "layout", layers, ["gzip", None, "gzip"])
        return write_tar_of_dir(tmp / "layout", tmp / "image.oci.tar")
    if kind == "docker-archive":
        write_docker_archive(tmp / "image.tar", layers)
        return tmp / "image.tar"
    write_docker_archive(tmp / "image.tar", layers, compression=["gzip"] * 3, modern=True)
    return tmp / "image.tar"


@pytest.mark.parametrize("kind", ["oci-layout", "oci-archive", "docker-archive", "docker-archive-modern"])
def test_layers_apply_in_order_with_whiteouts_links_and_modes(kind, layers, tmp_path):
    src = _source(kind, layers, tmp_path)
    with open_image(src) as image:
        assert image.kind == kind.removesuffix("-modern")
        assert len(image.layers) == 3
        stats = extract_image(image, tmp_path / "rootfs")
        image_id = image.image_id
    tree = snapshot(tmp_path / "rootfs")
    assert tree == EXPECTED
    hard = [os.lstat(tmp_path / "rootfs" / p).st_ino for p in ("bin/tool", "bin/tool-hard")]
    assert hard[0] == hard[1]
    assert stats.skipped == ["dev/null"] and stats.whiteouts == 3 and stats.hardlinks == 1
    # Same layers, same config: the id does not depend on the container format or compression.
    with open_image(_source("oci-layout", layers, tmp_path / "other")) as other:
        assert other.image_id == image_id


def test_opaque_whiteout_keeps_what_its_own_layer_adds_before_it(tmp_path):
    layers = [[E("d", "dir", mode=0o755), E("d/lower")],
              [E("d/upper", data=b"u"), E("d/.wh..wh..opq"), E("d/.wh.upper")]]
    write_oci_layout(tmp_path / "l", layers)
    with open_image(tmp_path / "l") as image:
        extract_image(image, tmp_path / "r")
    assert sorted(os.listdir(tmp_path / "r/d")) == ["upper"]


def _tamper(path: Path) -> None:
    data = bytearray(path.read_bytes())
    i = data.index(b"agent")
    data[i:i + 5] = b"AGENT"   # same size, still a valid tar
    path.write_bytes(bytes(data))


def test_a_layer_that_does_not_match_its_digest_is_refused_by_name(layers, tmp_path):
    info = write_oci_layout(tmp_path / "layout", layers, [None, None, None])
    blob = tmp_path / "layout/blobs/sha256" / info["layers"][1].split(":")[1]
    _tamper(blob)
    cache = ImageCache(tmp_path / "cache")
    with pytest.raises(ImageError, match=f"{blob}: content does not match its digest {info['layers'][1]}"):
        build_image(tmp_path / "layout", cache)
    assert cache.list() == []
    assert [p.name for p in (tmp_path / "cache/rootfs").iterdir()] == []  # the temp dir went too


def test_a_corrupt_gzip_layer_is_reported_as_a_digest_mismatch(layers, tmp_path):
    info = write_oci_layout(tmp_path / "layout", layers)
    blob = tmp_path / "layout/blobs/sha256" / info["layers"][0].split(":")[1]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    with open_image(tmp_path / "layout") as image, pytest.raises(ImageError, match=f"{blob}: content does not match"):
        extract_image(image, tmp_path / "rootfs")


def test_a_docker_archive_layer_is_checked_against_its_diff_id(layers, tmp_path):
    write_docker_archive(tmp_path / "image.tar", layers)
    raw = tmp_path / "image.tar"
    _tamper(raw)
    with open_image(raw) as image, pytest.raises(ImageError, match="does not match its diff_id"):
        extract_image(image, tmp_path / "rootfs")


def test_a_config_that_does_not_match_its_digest_is_refused(layers, tmp_path):
    info = write_oci_layout(tmp_path / "layout", layers)
    cfg = tmp_path / "layout/blobs/sha256" / info["config"].split(":")[1]
    cfg.write_text(cfg.read_text().replace("amd64", "arm64"))
    with pytest.raises(ImageError, match=f"{cfg}: content does not match"), open_image(tmp_path / "layout"):
        pass


HOSTILE = [
    ([E("../x")], "escapes the rootfs"),
    ([E("a/../../x")], "escapes the rootfs"),
    ([E("/etc/x")], "absolute path"),
    ([E("evil", "symlink", target="@OUT@"), E("evil/x", data=b"pwned")], "through the symlink 'evil'"),
    ([E("evil", "symlink", target="../../.."), E("evil/outside/x")], "through the symlink 'evil'"),
    ([E("d", "dir"), E("d/.wh..")], "invalid whiteout"),
    ([E("x", "hardlink", target="../outside/secret")], "escapes the rootfs"),
]


@pytest.mark.parametrize("entries, problem", HOSTILE)
def test_hostile_layers_are_refused_without_writing_outside(entries, problem, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    entries = [dataclasses.replace(e, target=e.target.replace("@OUT@", str(outside))) for e in entries]
    work = tmp_path / "w" / "x" / "y"
    work.mkdir(parents=True)
    write_oci_layout(work / "layout", [[E("keep")], entries])
    with open_image(work / "layout") as image, pytest.raises(ImageError, match=problem):
        extract_image(image, work / "rootfs")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    # Nothing landed beside the rootfs either (a '..' or a symlink to '../../..' would reach these).
    assert sorted(os.listdir(tmp_path)) == ["outside", "w"] and os.listdir(tmp_path / "w") == ["x"]
    assert os.listdir(tmp_path / "w/x") == ["y"] and sorted(os.listdir(work)) == ["layout", "rootfs"]


def test_a_layer_replacing_a_dir_by_a_symlink_cannot_write_through_it(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    write_oci_layout(tmp_path / "l", [[E("d", "dir"), E("d/a")],
                                      [E("d", "symlink", target=str(outside)), E("d/b", data=b"x")]])
    with open_image(tmp_path / "l") as image, pytest.raises(ImageError, match="through the symlink 'd'"):
        extract_image(image, tmp_path / "r")
    assert list(outside.iterdir()) == []


def test_zstd_layers_need_the_zstandard_module(tmp_path):
    try:
        import zstandard  # noqa: F401
    except ImportError:
        layout = tmp_path / "l"
        info = write_oci_layout(layout, [[E("a")]], [None])
        blob = layout / "blobs/sha256" / info["layers"][0].split(":")[1]
        blob.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 64)
        with open_image(layout) as image, pytest.raises(ImageError, match="zstd-compressed.*pip install zstandard"):
            extract_image(image, tmp_path / "r")
    else:
        write_oci_layout(tmp_path / "l", [[E("a", data=b"z")]], ["zstd"])
        with open_image(tmp_path / "l") as image:
            extract_image(image, tmp_path / "r")
        assert (tmp_path / "r/a").read_bytes() == b"z"


def test_an_index_of_several_images_needs_a_ref(tmp_path):
    write_oci_layout(tmp_path / "a", [[E("a")]], ref="one")
    write_oci_layout(tmp_path / "b", [[E("b")]], ref="two")
    shutil.copytree(tmp_path / "b/blobs", tmp_path / "a/blobs", dirs_exist_ok=True)
    index = json.loads((tmp_path / "a/index.json").read_text())
    index["manifests"] += json.loads((tmp_path / "b/index.json").read_text())["manifests"]
    (tmp_path / "a/index.json").write_text(json.dumps(index))
    with pytest.raises(ImageError, match="holds 2 images \\(one, two\\)"), open_image(tmp_path / "a"):
        pass
    with open_image(tmp_path / "a", ref="two") as image:
        extract_image(image, tmp_path / "r")
    assert os.listdir(tmp_path / "r") == ["b"]


# ---- the cache ----

def test_a_second_build_is_a_cache_hit_without_extracting(layers, tmp_path, monkeypatch):
    src = _source("oci-layout", layers, tmp_path)
    cache = ImageCache(tmp_path / "cache")
    entry, built = build_image(src, cache)
    assert built and snapshot(entry.payload) == EXPECTED
    assert entry.path.parent == tmp_path / "cache/rootfs" and entry.path.name.startswith("sha256-")
    assert entry.record.source == str(src) and entry.record.size > 0
    ino = os.lstat(entry.payload / "etc/passwd").st_ino
    monkeypatch.setattr(build_mod, "extract_image", lambda *a, **k: pytest.fail("extracted again"))
    again, built = build_image(src, cache)
    assert not built and again.path == entry.path
    assert os.lstat(again.payload / "etc/passwd").st_ino == ino
    # The same image from a docker-archive is the same entry.
    write_docker_archive(tmp_path / "same.tar", layers)
    assert build_image(tmp_path / "same.tar", cache) == (entry, False)
    assert [e.path for e in cache.list()] == [entry.path]
    assert cache.remove(entry.record.digest, "rootfs") and cache.list() == []
    assert not cache.remove(entry.record.digest, "rootfs")


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_half_built_entries_are_ignored_and_cleaned(layers, tmp_path):
    src = _source("oci-layout", layers, tmp_path)
    cache = ImageCache(tmp_path / "cache")
    with open_image(src) as image:
        digest = image.image_id
    final = cache.entry_path(digest, "rootfs")
    # A builder that died mid-extraction, and an entry without its record (copied in by hand).
    tmp = final.parent / f".tmp-{socket.gethostname()}-{_dead_pid()}-abcd1234"
    (tmp / "rootfs/etc").mkdir(parents=True)
    (final / "rootfs").mkdir(parents=True)
    (final / "rootfs/junk").write_text("half")
    live = final.parent / f".tmp-{socket.gethostname()}-{os.getppid()}-abcd1234"  # a live builder's
    live.mkdir()
    assert cache.lookup(digest, "rootfs") is None and cache.list() == []
    entry, built = build_image(src, cache)
    assert built and entry.path == final and snapshot(entry.payload) == EXPECTED
    assert sorted(p.name for p in final.parent.iterdir()) == sorted([final.name, live.name])


def _race(src: str, cache_dir: str, barrier, queue) -> None:
    cache = ImageCache(cache_dir)

    def slow_extract(image, payload):
        extract_image(image, payload)
        barrier.wait(timeout=30)   # both have built before either publishes
    build_mod.extract_image = slow_extract
    entry, built = build_image(src, cache)
    queue.put((str(entry.path), built, sorted(os.listdir(entry.payload))))


def test_concurrent_builders_of_one_image_leave_one_entry(layers, tmp_path):
    src = _source("docker-archive", layers, tmp_path)
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(src), str(tmp_path / "cache"), barrier, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len({r[0] for r in results}) == 1
    assert sorted(r[1] for r in results) == [False, False, True]
    assert all(r[2] == ["bin", "dev", "etc", "opt", "run", "usr", "var"] for r in results)
    cache = ImageCache(tmp_path / "cache")
    (entry,) = cache.list()
    assert snapshot(entry.payload) == EXPECTED
    assert os.listdir(tmp_path / "cache/rootfs") == [entry.path.name]


# ---- SIF, pulls, tools ----

def test_apptainer_and_skopeo_command_lines(tmp_path):
    assert apptainer_uri("/x/img.tar", "docker-archive") == "docker-archive:/x/img.tar"
    assert apptainer_uri("/x/img.oci.tar", "oci-archive") == "oci-archive:/x/img.oci.tar"
    assert apptainer_uri("/x/layout", "oci-layout", "v1") == "oci:/x/layout:v1"
    assert apptainer_uri("python:3.11", "docker-ref") == "docker://python:3.11"
    assert apptainer_build_command("o.sif", "docker-archive:/x/img.tar") == [
        "apptainer", "build", "o.sif", "docker-archive:/x/img.tar"]
    assert apptainer_build_command("o.sif", "docker://python:3.11", fakeroot=True) == [
        "apptainer", "build", "--fakeroot", "o.sif", "docker://python:3.11"]
    assert skopeo_copy_command("python:3.11", "/c/l") == ["skopeo", "copy", "docker://python:3.11", "oci:/c/l"]
    assert skopeo_copy_command("docker://a/b:c", "/l")[2] == "docker://a/b:c"


def test_missing_tools_say_what_to_install(layers, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    src = _source("docker-archive", layers, tmp_path)
    cache = ImageCache(tmp_path / "cache")
    with pytest.raises(ImageError, match="needs apptainer.*install Apptainer") as e:
        build_image(src, cache, "sif")
    assert f"apptainer build OUT.sif docker-archive:{src}" in str(e.value)
    with pytest.raises(ImageError, match="pulling python:3.11 needs skopeo.*install skopeo") as e:
        build_image("python:3.11", cache, "sif")
    assert "skopeo copy docker://python:3.11 oci:IMAGE-DIR" in str(e.value)
    assert "apptainer build OUT.sif docker://python:3.11" in str(e.value)
    assert cache.list() == []
    with pytest.raises(ImageError, match="no such file"):
        build_image(tmp_path / "missing.tar", cache)


def _fake_tool(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/bash\nset -e\n{body}\n")
    (bin_dir / name).chmod(0o755)


@pytest.mark.integration
def test_sif_and_pull_run_the_tools_into_the_cache(layers, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    # apptainer build [--fakeroot] OUT URI: write the arguments as the "image".
    _fake_tool(bin_dir, "apptainer", 'out="${@: -2:1}"; echo "$*" > "$out"')
    pulled = tmp_path / "registry-image"
    write_oci_layout(pulled, layers)
    _fake_tool(bin_dir, "skopeo", f'[[ $1 == copy && $2 == docker://python:3.11 ]]; cp -r {pulled} "${{3#oci:}}"')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    cache = ImageCache(tmp_path / "cache")
    src = _source("docker-archive", layers, tmp_path)
    entry, built = build_image(src, cache, "sif", fakeroot=True)
    assert built and entry.payload.name == "image.sif"
    args = entry.payload.read_text().split()
    assert args[:2] == ["build", "--fakeroot"] and args[3] == f"docker-archive:{src}"
    assert args[2].startswith(str(tmp_path / "cache/sif/.tmp-")) and args[2].endswith("/image.sif")  # built aside
    entry2, built = build_image("python:3.11", cache)
    assert built and snapshot(entry2.payload) == EXPECTED and entry2.record.source == "python:3.11"
    assert entry2.record.digest == entry.record.digest  # same image, other format
    assert list((tmp_path / "cache/.pulls").iterdir()) == []


# ---- many images: Slurm array, module, CLI ----

def test_the_array_script_runs_the_build_of_its_task_index(tmp_path):
    command = ["-m", "agentrl.cli", "images", "build", "/data/with space.tar", "prompts.jsonl", "--cache", "/c"]
    outcomes = tmp_path / "out dir"
    script = array_script(command, [0, 2, 5], parallelism=2, outcomes=outcomes, sbatch_options=["--time=01:00:00"])
    lines = script.splitlines()
    assert "#SBATCH --array=0,2,5%2" in lines and "#SBATCH --time=01:00:00" in lines
    assert f"#SBATCH --output={outcomes}/%a.out" in lines
    body = lines[lines.index("set -euo pipefail"):]
    assert lines[0] == "#!/bin/bash" and not any(ln.startswith("#SBATCH") for ln in body)
    (tmp_path / "job.sh").write_text(script)
    _fake_tool(tmp_path / "bin", "py", 'printf "%s\\n" "$@"')
    r = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True, check=True,
                       env={**os.environ, "SLURM_ARRAY_TASK_ID": "5", "AGENTRL_PYTHON": str(tmp_path / "bin/py")})
    assert r.stdout.splitlines() == [*command, "--job-index", "5", "--outcomes", str(outcomes)]
    with pytest.raises(ValueError):
        array_script(command, [0], parallelism=0, outcomes=outcomes)
    with pytest.raises(ValueError):
        array_script(command, [], parallelism=1, outcomes=outcomes)


def test_watching_an_array_shows_progress_and_names_a_task_that_died_without_an_outcome(tmp_path):
    names = {0: "a", 3: "b", 4: "c"}
    polls = []

    def alive() -> bool:        # task 0 ends built, then 4 fails, then the job is gone; 3 never said
        polls.append(len(polls))
        if len(polls) == 1:
            write_outcome(tmp_path, JobOutcome(index=0, name="a", outcome="built", message="/c/rootfs/x"))
        if len(polls) == 2:
            write_outcome(tmp_path, JobOutcome(index=4, name="c", outcome="failed", message="step 2/3 ..."))
        return len(polls) < 3

    out = io.StringIO()
    done = watch(tmp_path, [0, 3, 4], names, alive, sleep=lambda s: None, out=out)
    assert out.getvalue().splitlines() == [
        "0 built, 0 cached, 0 failed, 3 remaining", "1 built, 0 cached, 0 failed, 2 remaining",
        "1 built, 0 cached, 2 failed, 0 remaining"]
    assert [done[i].outcome for i in (0, 3, 4)] == ["built", "failed", "failed"]
    assert "ended without an outcome" in done[3].message and str(tmp_path / "3.out") in done[3].message


@pytest.mark.integration
def test_the_module_builds_and_prints_the_paths(layers, tmp_path):
    src = _source("docker-archive", layers, tmp_path)
    cache = ["--cache", str(tmp_path / "cache")]
    cmd = [sys.executable, "-m", "hpc.images.build", str(src)]
    r = subprocess.run([*cmd, *cache], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path.name == "rootfs" and snapshot(path) == EXPECTED
    assert "built" in r.stderr
    r = subprocess.run([*cmd, str(tmp_path / "missing.tar"), *cache], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 1 and r.stdout.strip() == str(path)
    assert "cached" in r.stderr and "missing.tar: no such file" in r.stderr


def test_the_agentrl_images_build_command(layers, tmp_path, capsys):
    from agentrl.cli import main
    src = _source("oci-layout", layers, tmp_path)
    assert main(["images", "build", str(src), "--cache", str(tmp_path / "cache")]) == 0
    assert snapshot(Path(capsys.readouterr().out.strip())) == EXPECTED
    t0 = time.monotonic()
    assert main(["images", "build", str(src), "--cache", str(tmp_path / "cache")]) == 0
    assert time.monotonic() - t0 < 5


@pytest.mark.skipif(os.geteuid() != 0, reason="the layers format and an overlay mount need root")
def test_the_layers_format_stacks_to_the_same_tree_and_keeps_a_shared_layer_once(layers, tmp_path):
    cache = ImageCache(tmp_path / "cache")
    first = _source("oci-layout", layers, tmp_path / "a")
    second_layers = [*layers[:2], [E("opt/app/other.txt", data=b"other\n")]]    # the same base, its own top
    write_oci_layout(tmp_path / "b", second_layers, ["gzip", "gzip", None])
    entry, built = build_image(first, cache, "layers")
    assert built and entry.payload.read_text().count("\n") == 3
    assert build_image(first, cache, "layers")[1] is False
    entry_b, _ = build_image(tmp_path / "b", cache, "layers")
    assert len(cache.list("layer")) == 4            # three layers, and the second image's own top: the base once
    merged = tmp_path / "merged"
    for e, expected in ((entry, EXPECTED), (entry_b, None)):
        merged.mkdir()
        lowers = ":".join(map(str, cache.layer_dirs(e)))
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lowers}", str(merged)], check=True)
        try:
            tree = snapshot(merged)
        finally:
            subprocess.run(["umount", str(merged)], check=True)
        merged.rmdir()
        if expected is not None:
            assert tree == expected                  # whiteouts, an opaque directory, a dir over a file
        else:
            assert tree["opt/app/other.txt"] == ("f", 0o644, b"other\n") and "bin/sh-link" in tree


@pytest.mark.skipif(os.geteuid() != 0, reason="the layers format (whiteouts are device nodes) needs root")
@pytest.mark.parametrize("entries, problem", [
    *HOSTILE,
    # a whiteout is a device node made by us: it must not be made through a symlink out of the layer
    ([E("evil", "symlink", target="@OUT@"), E("evil/.wh.secret")], "through the symlink 'evil'"),
    ([E("evil", "symlink", target="@OUT@"), E("evil/.wh..wh..opq")], "through the symlink 'evil'"),
])
def test_hostile_layers_are_refused_as_layers_too_without_touching_outside(entries, problem, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    entries = [dataclasses.replace(e, target=e.target.replace("@OUT@", str(outside))) for e in entries]
    write_oci_layout(tmp_path / "layout", [entries])
    with open_image(tmp_path / "layout") as image, pytest.raises(ImageError, match=problem):
        extract_layer(image.layers[0], tmp_path / "tree")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"] and (outside / "secret").read_text() == "s"
    with pytest.raises(OSError):                  # no opaque mark was set on the directory outside either
        os.getxattr(outside, "trusted.overlay.opaque")


@pytest.mark.skipif(os.geteuid() != 0, reason="the layers format (whiteouts are device nodes) needs root")
def test_a_layers_own_device_entries_are_not_made_so_it_cannot_forge_whiteouts(tmp_path):
    write_oci_layout(tmp_path / "layout", [[E("etc/passwd", "chr"), E("etc/ok", data=b"ok")]])
    with open_image(tmp_path / "layout") as image:
        stats = extract_layer(image.layers[0], tmp_path / "tree")
    assert stats.skipped == ["etc/passwd"] and not os.path.lexists(tmp_path / "tree/etc/passwd")
