"""Sandbox start latency and cycle throughput: bwrap with our copy-on-write layer, beside a full rootfs copy.

The baseline is what mini-swe-agent's Singularity backend does per rollout (`singularity build
--sandbox` of the image into a fresh directory), emulated as `cp -a` of the whole rootfs, then bwrap
on that copy; the copy is removed at stop. It copies from a warm page cache, which flatters it.

(a) ready: start() + exec `true` returning, p50/p95 over --rounds, on an image of >= --image-mb MiB
    figure:   BwrapSandbox(SandboxSpec(rootfs=IMAGE, workdir_source=None)): an overlay over the whole rootfs
    baseline: cp -a IMAGE -> fresh dir, bwrap --bind COPY /
(b) cycles/s of start + exec as the agent + unittest as root (the grade) + stop, at each --concurrency
    (asyncio tasks), with a small work tree:
    figure:   BwrapSandbox(SandboxSpec(rootfs=IMAGE, workdir_source=REPO)): image read-only, work tree overlaid
    baseline: cp -a IMAGE, cp -a REPO into the copy's /testbed, bwrap on the copy
    Section (b) runs within --budget-s; a point that would not fit is skipped and says so.
(c) density: --density sandboxes at once at Harbor's default limits, each writing --write-mib MiB to its
    work tree and running its tests: RAM held and disk taken per sandbox, and how many this node holds
    figure:   storage "disk" (an ext4 image per sandbox on the scratch disk)
    baseline: storage "tmpfs" (its layers in RAM)      (benchmarks/sandbox_density.py)

Both sections also run the runtime as it was before its hardening (no user namespace, seccomp filter,
capability drop or limits; exec by nsenter): ours / unhardened is what the hardening costs.

ratio = figure / baseline everywhere (below 1 is faster for times, above 1 is better for cycles/s).
The image is built once from the host's /usr (offline) and cached under --dir; needs root (overlay mounts).

    python -m benchmarks.sandbox_bench [--dir DIR] [--rounds 20] [--concurrency 1,8,32] [--budget-s 300]
                                       [--image-mb 300] [--density 8] [--write-mib 1024] [--quick] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import concurrent.futures
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import replace

from benchmarks.common import percentile
from benchmarks.sandbox_density import measure_density
from hpc.images.hostroot import build_host_rootfs
from hpc.sandbox.base import (
    AGENT_GID,
    AGENT_UID,
    ExecResult,
    SandboxContext,
    SandboxError,
    SandboxSpec,
    as_argv,
    run_process,
    sandbox_env,
)
from hpc.sandbox.bwrap import BwrapSandbox
from hpc.sandbox.bwrap_args import bwrap_argv

TARGET_READY_P50_S = 0.3
TARGET_SPEEDUP = 20.0          # the copy's p50 / ours: ratio <= 1 / 20
MIN_HARDENING_RATIO = 0.8      # the hardening may cost at most 20% of the unhardened cycles/s
IMAGE_VERSION = 2

REPO_FILES = {
    "calc.py": "def add(a, b):\n    return a + b\n",
    "test_calc.py": ("import unittest\n\nfrom calc import add\n\n\nclass TestAdd(unittest.TestCase):\n"
                     "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n\n"
                     "if __name__ == '__main__':\n    unittest.main()\n"),
}
AGENT_CMD = "echo '# touched by the agent' >> calc.py && python3 -c 'import calc; print(calc.add(2, 3))'"
GRADE_CMD = ["python3", "-m", "unittest", "-q", "test_calc"]


# ---------------------------------------------------------------- the image

def _du(path: Path) -> tuple[int, int]:
    """(bytes on disk as du counts them, number of entries)."""
    kib = int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])
    n = sum(1 + len(d) + len(f) for _, d, f in os.walk(path)) - 1
    return kib * 1024, n


def build_image(cache: Path, min_mib: int, log) -> dict:
    """A rootfs of >= min_mib MiB from the host's /usr, built once under `cache` and reused."""
    home = cache / f"image-v{IMAGE_VERSION}-{min_mib}mib"
    meta_file = home / "image.json"
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text())
        if Path(meta["path"]).is_dir():
            meta["cached"] = True
            return meta
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    root = home / "rootfs"
    log(f"building a {min_mib} MiB image from the host's /usr in {root} (once) ...")
    t0 = time.monotonic()
    build_host_rootfs(root, min_bytes=min_mib * 2**20)
    target = min_mib * 2**20
    nbytes, files = _du(root)
    if nbytes < target:
        raise SystemExit(f"sandbox_bench: the image at {root} is {nbytes / 2**20:.0f} MiB, short of the "
                         f"{min_mib} MiB asked for: the host's /usr is too small")
    meta = {"path": str(root), "bytes": nbytes, "mib": round(nbytes / 2**20, 1), "entries": files,
            "min_mib": min_mib, "build_s": round(time.monotonic() - t0, 1)}
    meta_file.write_text(json.dumps(meta))
    meta["cached"] = False
    return meta


# ---------------------------------------------------------------- the baseline runtime

class CopySandbox(BwrapSandbox):
    """The full-copy approach: `cp -a` of the whole rootfs per sandbox (work tree copied into it), then
    bwrap on the copy, writable, exactly as BwrapSandbox runs a rootfs; stop() removes the copy."""

    def _plan(self, scratch: Path) -> dict:
        spec = self.spec
        root = scratch / "rootfs"
        r = subprocess.run(["cp", "-a", spec.rootfs, str(root)], capture_output=True, text=True)
        if r.returncode != 0:
            raise SandboxError(f"copying the rootfs failed: {r.stderr.strip()}")
        if spec.workdir_source:
            wd = root / spec.workdir.lstrip("/")
            shutil.rmtree(wd, ignore_errors=True)
            subprocess.run(["cp", "-a", spec.workdir_source, str(wd)], check=True, capture_output=True)
        argv = bwrap_argv(replace(spec, workdir_source=None), workdir_host=None, etc_host=None,
                          rootfs_host=str(root), home_host=str(scratch / "disk" / "home"))
        return {"bwrap": argv, "disk": str(scratch / "disk"), "layers": [], "scratch": str(scratch),
                "image_root": self._image_root(str(root), argv, agent_tree=True), "limits": {}, "forwarder": None}


class UnhardenedSandbox(SandboxContext):
    """The runtime before the hardening, as the hardening's baseline: bwrap as the host's root with
    no user namespace, no seccomp filter, no capability drop and no limits; every exec joins it with
    nsenter as host root or uid 1000. Same overlays, same bwrap command line."""

    def __init__(self, spec: SandboxSpec):
        self.spec, self.init_pid, self._init, self._scratch = spec, None, None, None

    async def start(self) -> None:
        await asyncio.to_thread(self._start)

    def _start(self) -> None:
        spec = self.spec
        self._scratch = scratch = Path(tempfile.mkdtemp(prefix="unhardened-", dir=spec.scratch_dir))
        try:
            setup, layers = [], {}
            for name, source, owner in (("root", spec.rootfs, None), ("work", spec.workdir_source, AGENT_UID)):
                if source:
                    d = {k: scratch / name / k for k in ("upper", "work", "merged")}
                    for x in d.values():
                        x.mkdir(parents=True)
                    setup.append(shlex.join(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={source},upperdir="
                                             f"{d['upper']},workdir={d['work']},metacopy=on", str(d["merged"])]))
                    if owner is not None:
                        setup.append(shlex.join(["chown", "-R", f"{owner}:{owner}", str(d["merged"])]))
                    layers[name] = str(d["merged"])
            home = scratch / "home"
            home.mkdir()
            os.chown(home, AGENT_UID, AGENT_GID)
            argv = bwrap_argv(spec, workdir_host=layers.get("work"), etc_host=None, rootfs_host=layers["root"],
                              home_host=str(home))
            rfd, wfd = os.pipe()
            argv[argv.index("@INFO_FD@")] = str(wfd)
            argv = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                    " && ".join([*setup, 'exec "$@"']), "sh", *argv]
            self._init = subprocess.Popen(argv, pass_fds=(wfd,), env={}, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
            os.close(wfd)
            buf = b""
            while True:         # bwrap keeps the fd open: read until the JSON is whole
                chunk = os.read(rfd, 4096)
                if not chunk:
                    raise SandboxError(f"bwrap exited: {self._init.stderr.read().decode(errors='replace')}")
                buf += chunk
                try:
                    self.init_pid = int(json.loads(buf)["child-pid"])
                    break
                except ValueError:
                    continue
            os.close(rfd)
            cmdline = Path(f"/proc/{self.init_pid}/cmdline")
            while cmdline.read_bytes() != b"sleep\0infinity\0":
                time.sleep(0.002)
        except BaseException:
            self._stop()
            raise

    async def exec(self, command, *, user="agent", cwd=None, env=None, timeout_s=None, stdin=None) -> ExecResult:
        uid = 0 if user == "root" else AGENT_UID
        argv = ["nsenter", "-t", str(self.init_pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "-S", str(uid),
                "-G", str(uid), "--", "/bin/sh", "-c", 'cd "$0" && exec "$@"', cwd or self.spec.workdir,
                *as_argv(command)]
        return await run_process(argv, env=sandbox_env(self.spec, env, user), stdin=stdin, timeout_s=timeout_s)

    async def stop(self) -> None:
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        if self._init is not None and self._init.poll() is None:
            os.killpg(self._init.pid, signal.SIGKILL)
            self._init.wait()
        self._init = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)


APPROACHES = {"overlay": BwrapSandbox, "copy": CopySandbox, "unhardened": UnhardenedSandbox}
LABELS = {"overlay": "bwrap + overlay (ours)", "copy": "cp -a rootfs + bwrap", "unhardened": "ours, unhardened"}


# ---------------------------------------------------------------- measurements

def _ratio(figure: float, baseline: float) -> float | None:
    return round(figure / baseline, 4) if baseline else None


async def _ready_once(kind: str, image: str, scratch: str) -> tuple[float, float]:
    sb = APPROACHES[kind](SandboxSpec(rootfs=image, workdir_source=None, scratch_dir=scratch))
    t0 = time.perf_counter()
    try:
        await sb.start()
        r = await sb.exec(["true"], cwd="/")
        ready = time.perf_counter() - t0
        if r.exit_code != 0:
            raise SandboxError(f"{kind}: `true` exited {r.exit_code}: {r.stderr.decode(errors='replace')}")
    finally:
        t1 = time.perf_counter()
        await sb.stop()
    return ready, time.perf_counter() - t1


async def measure_ready(image: str, scratch: str, rounds: int) -> dict:
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in APPROACHES}
    for k in APPROACHES:                      # warm-up: page cache, first mount
        await _ready_once(k, image, scratch)
    for _ in range(rounds):                   # interleaved, so drift hits both alike
        for k in APPROACHES:
            times[k].append(await _ready_once(k, image, scratch))
    out = {}
    for k, ts in times.items():
        ready, stop = [t[0] for t in ts], [t[1] for t in ts]
        out[k] = {"name": LABELS[k], "p50_s": round(percentile(ready, 0.5), 4),
                  "p95_s": round(percentile(ready, 0.95), 4), "stop_p50_s": round(percentile(stop, 0.5), 4)}
    fig, base = out["overlay"], out["copy"]
    ratio_p50 = _ratio(fig["p50_s"], base["p50_s"])
    return {"rounds": rounds, "figure": fig, "baseline": base, "ratio_p50": ratio_p50,
            "unhardened": out["unhardened"], "hardening_ratio_p50": _ratio(fig["p50_s"], out["unhardened"]["p50_s"]),
            "ratio_p95": _ratio(fig["p95_s"], base["p95_s"]),
            "target": {"p50_s": TARGET_READY_P50_S, "max_ratio_p50": round(1 / TARGET_SPEEDUP, 4)},
            "meets_target": bool(fig["p50_s"] <= TARGET_READY_P50_S and ratio_p50 is not None
                                 and ratio_p50 <= 1 / TARGET_SPEEDUP)}


async def _cycle(kind: str, spec: SandboxSpec) -> None:
    sb = APPROACHES[kind](spec)
    await sb.start()
    try:
        r = await sb.exec(AGENT_CMD, timeout_s=60)
        if r.exit_code != 0 or r.stdout != b"5\n":
            raise SandboxError(f"{kind}: the agent's command failed ({r.exit_code}): "
                               f"{r.stderr.decode(errors='replace')}")
        g = await sb.exec(GRADE_CMD, user="root", timeout_s=60)
        if g.exit_code != 0:
            raise SandboxError(f"{kind}: the grade failed ({g.exit_code}): {g.stderr.decode(errors='replace')}")
    finally:
        await sb.stop()


async def measure_cycles(kind: str, spec: SandboxSpec, concurrency: int, seconds: float) -> dict:
    """`concurrency` tasks run cycles back to back; none starts a cycle after `seconds`, each runs at least one."""
    loop = asyncio.get_running_loop()
    # start() and stop() run in threads: asyncio's default pool (min(32, cpus + 4) = 6 on 2 cores) would cap
    # how many sandboxes start or stop at once below the concurrency asked for.
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=concurrency + 4))
    done = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds

    async def worker() -> None:
        nonlocal done
        while True:
            await _cycle(kind, spec)
            done += 1
            if time.perf_counter() >= deadline:
                return

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = round(time.perf_counter() - t0, 3)
    return {"name": LABELS[kind], "cycles": done, "wall_s": wall, "cycles_per_s": round(done / wall, 4)}


def _make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    for name, text in REPO_FILES.items():
        (path / name).write_text(text)
    return path


async def measure_throughput(image: dict, scratch: str, concurrency: list[int], budget_s: float,
                             ready: dict, log) -> tuple[list[dict], list[str]]:
    repo = _make_repo(Path(scratch) / "repo")
    spec = SandboxSpec(rootfs=image["path"], workdir_source=str(repo), scratch_dir=scratch)
    points = [(c, k) for c in concurrency for k in APPROACHES]
    weight = {"overlay": 1.0, "copy": 2.0, "unhardened": 1.0}   # the copy needs longer to reach a steady state
    t_start = time.monotonic()
    per_cycle = {k: ready[k]["p50_s"] + ready[k]["stop_p50_s"] + 0.2 for k in APPROACHES}  # first guess
    rate: dict[str, float] = {}                # the latest measured cycles/s of each approach
    rows = {c: {"concurrency": c, "figure": None, "baseline": None, "unhardened": None, "ratio": None,
                "hardening_ratio": None, "skipped": []} for c in concurrency}
    skipped = []
    for i, (c, k) in enumerate(points):
        remaining = budget_s - (time.monotonic() - t_start)
        slot = remaining * weight[k] / sum(weight[kk] for _, kk in points[i:])
        # One cycle per task, at no better than the rate measured last (at a lower concurrency), must fit.
        est = c / rate[k] if k in rate else per_cycle[k] * c
        why = None
        if est > remaining:
            why = (f"{LABELS[k]} at concurrency {c}: one cycle per task needs ~{est:.0f} s, "
                   f"{max(remaining, 0):.0f} s of --budget-s left")
        elif k == "copy" and c * image["bytes"] * 1.2 > shutil.disk_usage(scratch).free:
            why = (f"{LABELS[k]} at concurrency {c}: {c} copies of {image['mib']:.0f} MiB do not fit "
                   f"on {scratch}'s filesystem")
        if why:
            skipped.append(why)
            rows[c]["skipped"].append(why)
            log(f"  skipped: {why}")
            continue
        r = await measure_cycles(k, spec, c, max(min(slot, remaining) - est, 0.0))
        rate[k] = r["cycles_per_s"]
        rows[c][{"overlay": "figure", "copy": "baseline", "unhardened": "unhardened"}[k]] = r
        log(f"  {LABELS[k]:<24} concurrency {c:>3}: {r['cycles']:>4} cycles in {r['wall_s']:>6.1f} s "
            f"= {r['cycles_per_s']:.2f}/s")
    for row in rows.values():
        if row["figure"] and row["baseline"]:
            row["ratio"] = _ratio(row["figure"]["cycles_per_s"], row["baseline"]["cycles_per_s"])
        if row["figure"] and row["unhardened"]:
            row["hardening_ratio"] = _ratio(row["figure"]["cycles_per_s"], row["unhardened"]["cycles_per_s"])
    return list(rows.values()), skipped


# ---------------------------------------------------------------- main

def _parse_concurrency(ap: argparse.ArgumentParser, text: str) -> list[int]:
    try:
        cs = [int(p) for p in text.split(",")]
    except ValueError:
        cs = []
    if not cs or any(c < 1 for c in cs):
        ap.error(f"--concurrency must be positive integers separated by commas, got {text!r}")
    if len(set(cs)) != len(cs):
        ap.error(f"--concurrency has a repeated value: {text!r}")
    return cs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None,
                    help="where the image cache and the sandboxes live (default: "
                         f"{Path(tempfile.gettempdir()) / 'agentrl-sandbox-bench'}, kept for the image cache)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of (a) per approach (default 20; --quick 3)")
    ap.add_argument("--concurrency", default=None, help="comma-separated task counts for (b) (default 1,8,32; "
                                                        "--quick 1,2)")
    ap.add_argument("--budget-s", type=float, default=None, help="wall-clock budget of (b) in seconds "
                                                                 "(default 300; --quick 16)")
    ap.add_argument("--image-mb", type=int, default=None, help="least image size in MiB (default 300; --quick 20)")
    ap.add_argument("--density", type=int, default=None, help="sandboxes at once in (c) (default 8; --quick 2)")
    ap.add_argument("--write-mib", type=int, default=None, help="MiB each writes to its work tree in (c) "
                                                                "(default 1024; --quick 64)")
    ap.add_argument("--quick", action="store_true", help="tiny settings, for tests")
    ap.add_argument("--json", action="store_true", help="end with one JSON object of the figures")
    args = ap.parse_args(argv)
    q = args.quick
    rounds = args.rounds if args.rounds is not None else (3 if q else 20)
    concurrency = _parse_concurrency(ap, args.concurrency or ("1,2" if q else "1,8,32"))
    budget_s = args.budget_s if args.budget_s is not None else (16.0 if q else 300.0)
    image_mib = args.image_mb if args.image_mb is not None else (20 if q else 300)
    density = args.density if args.density is not None else (2 if q else 8)
    write_mib = args.write_mib if args.write_mib is not None else (64 if q else 1024)
    if density < 1 or write_mib < 1:
        ap.error(f"--density and --write-mib must be at least 1, got {density} and {write_mib}")
    if rounds < 1:
        ap.error(f"--rounds must be at least 1, got {rounds}")
    if not budget_s > 0:
        ap.error(f"--budget-s must be positive, got {budget_s}")
    if image_mib < 1:
        ap.error(f"--image-mb must be at least 1, got {image_mib}")
    if not q and image_mib < 300:
        ap.error(f"--image-mb must be at least 300 outside --quick (the comparison is about a large image), "
                 f"got {image_mib}")
    if args.dir is not None and not Path(args.dir).is_dir():
        ap.error(f"--dir {args.dir} is not a directory")
    if os.geteuid() != 0:
        ap.error("needs root: the copy-on-write layer is an overlay mount (run it as root, e.g. with sudo)")
    for tool, pkg in (("bwrap", "bubblewrap"), ("nsenter", "util-linux"), ("ldd", "libc-bin"), ("cp", "coreutils"),
                      ("/usr/bin/python3", "python3-seccomp")):
        if shutil.which(tool) is None:
            ap.error(f"{tool} is not installed (Debian: apt-get install {pkg})")

    def log(msg: str) -> None:
        print(msg, flush=True)

    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir()) / "agentrl-sandbox-bench"
    base.mkdir(parents=True, exist_ok=True)
    image = build_image(base, image_mib, log)
    how = " (cached)" if image["cached"] else f", built in {image['build_s']} s"
    log(f"image: {image['path']}  {image['mib']:.0f} MiB on disk (du), {image['entries']} entries{how}")
    log(f"cpus: {os.cpu_count()}  sandboxes under: {base}")

    scratch = tempfile.mkdtemp(prefix="run-", dir=base)
    try:
        log(f"\n(a) start to first exec ready (start() + exec `true`), {rounds} rounds each, interleaved")
        ready = asyncio.run(measure_ready(image["path"], scratch, rounds))
        log(f"{'':<26}{'p50 s':>8}{'p95 s':>8}{'stop p50 s':>12}")
        for key in ("figure", "baseline", "unhardened"):
            r = ready[key]
            log(f"{r['name']:<26}{r['p50_s']:>8.3f}{r['p95_s']:>8.3f}{r['stop_p50_s']:>12.3f}")
        sp = 1 / ready["ratio_p50"] if ready["ratio_p50"] else float("inf")
        log(f"{'ratio (ours / copy)':<26}{ready['ratio_p50']:>8.3f}{ready['ratio_p95']:>8.3f}"
            f"    = {sp:.1f}x faster at p50")
        log(f"{'ratio (ours / unhardened)':<26}{ready['hardening_ratio_p50']:>8.3f}   (the hardening's cost)")
        log(f"target: p50 <= {TARGET_READY_P50_S} s and >= {TARGET_SPEEDUP:.0f}x faster than the copy "
            f"(ratio <= {1 / TARGET_SPEEDUP:.2f}): {'met' if ready['meets_target'] else 'NOT met'}")

        log(f"\n(b) cycles/s of start + agent exec + unittest as root + stop, budget {budget_s:.0f} s")
        rows, skipped = asyncio.run(measure_throughput(image, scratch, concurrency, budget_s,
                                                       {"overlay": ready["figure"], "copy": ready["baseline"],
                                                        "unhardened": ready["unhardened"]}, log))
        log(f"{'concurrency':>11}{'ours cycles/s':>15}{'copy cycles/s':>15}{'ratio':>8}"
            f"{'unhardened':>12}{'ours/unhardened':>17}  (target >= {MIN_HARDENING_RATIO})")
        for row in rows:
            f = f"{row['figure']['cycles_per_s']:.2f}" if row["figure"] else "skipped"
            b = f"{row['baseline']['cycles_per_s']:.2f}" if row["baseline"] else "skipped"
            u = f"{row['unhardened']['cycles_per_s']:.2f}" if row["unhardened"] else "skipped"
            rt = f"{row['ratio']:.2f}" if row["ratio"] is not None else "-"
            hr = f"{row['hardening_ratio']:.2f}" if row["hardening_ratio"] is not None else "-"
            log(f"{row['concurrency']:>11}{f:>15}{b:>15}{rt:>8}{u:>12}{hr:>17}")
        log("skipped: " + ("; ".join(skipped) if skipped else "nothing"))

        log(f"\n(c) density: {density} sandboxes at once at Harbor's defaults (1 CPU, 2 GiB, 10 GiB storage), "
            f"each writing {write_mib} MiB to its work tree, then its tests")
        dense = measure_density(os.path.join(scratch, "density"), str(_make_repo(Path(scratch) / "density-repo")),
                                density, write_mib, log)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log("baseline: mini-swe-agent's Singularity backend builds a --sandbox directory per rollout; emulated as "
        "cp -a of the rootfs (from a warm page cache) + bwrap on the copy")
    if args.json:
        print(json.dumps({"benchmark": "sandbox", "dir": str(base), "cpus": os.cpu_count(), "quick": q,
                          "image": {k: image[k] for k in ("path", "bytes", "mib", "entries", "cached")},
                          "ready": ready, "throughput": rows, "budget_s": budget_s, "skipped": skipped,
                          "density": dense}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
