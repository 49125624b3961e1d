"""Images that share a base: the disk they take stored as layers against flattened, and sandbox start time.

N images, each the same base layer (a rootfs from the host's programs, >= --base-mib) and a small top
layer of its own, as a data set's task images are (SWE-bench Verified's 500 share most of their bytes):

(a) storage, on disk (du): every image built both ways into one cache
    figure:   the layers format: each layer once (CACHE/layer/), each image a list of its layers
    baseline: the rootfs format: each image a flattened tree of its own
    also:     the unique layers' bytes (their uncompressed tars), which the figure is held to: <= 1.1 x
(b) start to first exec (start() + exec `true`), p50 over --rounds, interleaved
    figure:   bwrap on the layers, stacked by overlayfs (SandboxSpec.rootfs_layers)
    baseline: bwrap on the flattened rootfs (what every sandbox ran before)
    target:   within 20% (ratio <= 1.2)

ratio = figure / baseline. Needs root (overlay mounts, whiteout devices). The images are made offline
with hpc/images/oci_writer.py (uncompressed layers, so a layer's blob is its tar) and kept under --dir.

    python -m benchmarks.image_bench [--dir DIR] [--images 4] [--base-mib 150] [--rounds 15] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time

from benchmarks.common import percentile
from hpc.images.build import build_image
from hpc.images.cache import ImageCache
from hpc.images.hostroot import build_host_rootfs
from hpc.images.oci_writer import E, dir_entries, write_oci_layout
from hpc.sandbox.base import SandboxSpec
from hpc.sandbox.bwrap import BwrapSandbox

ROOT = Path(__file__).resolve().parents[1]

TARGET_STORAGE = 1.1      # layers on disk / the unique layers' bytes
TARGET_START = 1.2        # layered start p50 / flattened start p50


def du(*paths: Path) -> int:
    """Bytes on disk as du counts them (a hardlinked file once)."""
    out = subprocess.run(["du", "-skc", *map(str, paths)], capture_output=True, text=True, check=True).stdout
    return int(out.splitlines()[-1].split()[0]) * 1024


def make_images(work: Path, n: int, base_mib: int, log) -> list[Path]:
    """N OCI layouts: one base layer they share byte for byte, and a top layer each of its own."""
    layouts = [work / f"image-{i}" for i in range(n)]
    if all((p / "index.json").exists() for p in layouts):
        return layouts
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log(f"making {n} images on a {base_mib} MiB base from the host's programs (once, in {work}) ...")
    build_host_rootfs(work / "base", min_bytes=base_mib * 2**20)
    base = dir_entries(work / "base")
    for i, layout in enumerate(layouts):
        top = [E("testbed", "dir", mode=0o755), E(f"testbed/task-{i}.py", data=f"TASK = {i}\n".encode() * 2000),
               E("etc/agentrl-image", data=f"image {i}\n".encode())]
        write_oci_layout(layout, [base, top], compression=[None, None])
    return layouts


def storage(layouts: list[Path], cache: ImageCache) -> dict:
    for layout in layouts:
        build_image(layout, cache, "rootfs")
        build_image(layout, cache, "layers")
    unique = {}
    for layout in layouts:      # uncompressed layers: a blob's size is its tar's
        index = json.loads((layout / "index.json").read_text())
        manifest = json.loads((layout / "blobs/sha256" / index["manifests"][0]["digest"][7:]).read_text())
        unique.update({d["digest"]: d["size"] for d in manifest["layers"]})
    flattened = du(*(e.path for e in cache.list("rootfs")))
    layered = du(cache.root / "layer", cache.root / "layers")
    unique_bytes = sum(unique.values())
    return {"images": len(layouts), "unique_layers": len(unique), "unique_layer_bytes": unique_bytes,
            "figure_layers_bytes": layered, "baseline_flattened_bytes": flattened,
            "ratio": round(layered / flattened, 4), "layers_over_unique": round(layered / unique_bytes, 4),
            "target_layers_over_unique": TARGET_STORAGE, "meets_target": layered <= TARGET_STORAGE * unique_bytes}


async def ready_once(spec: SandboxSpec) -> float:
    sb = BwrapSandbox(spec)
    t0 = time.perf_counter()
    try:
        await sb.start()
        r = await sb.exec(["true"], cwd="/")
        if r.exit_code != 0:
            raise SystemExit(f"image_bench: `true` exited {r.exit_code}: {r.stderr.decode(errors='replace')}")
        return time.perf_counter() - t0
    finally:
        await sb.stop()


async def start_times(cache: ImageCache, layout: Path, rounds: int, scratch: str) -> dict:
    source = os.path.abspath(layout)
    flat, stack = cache.find(source, "rootfs"), cache.find(source, "layers")
    specs = {"baseline": SandboxSpec(rootfs=str(flat.payload), scratch_dir=scratch),
             "figure": SandboxSpec(rootfs_layers=tuple(map(str, cache.layer_dirs(stack))), scratch_dir=scratch)}
    times: dict[str, list[float]] = {k: [] for k in specs}
    for spec in specs.values():       # warm-up: page cache, first mount
        await ready_once(spec)
    for _ in range(rounds):           # interleaved, so drift hits both alike
        for k, spec in specs.items():
            times[k].append(await ready_once(spec))
    p50 = {k: percentile(v, 0.5) for k, v in times.items()}
    ratio = p50["figure"] / p50["baseline"]
    return {"rounds": rounds, "figure_layers_p50_s": round(p50["figure"], 6),
            "baseline_flattened_p50_s": round(p50["baseline"], 6), "ratio": round(ratio, 4),
            "target_ratio": TARGET_START, "meets_target": ratio <= TARGET_START}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="image_bench.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=ROOT / ".cache" / "image-bench", help="where the images are kept")
    ap.add_argument("--images", type=int, default=4, help="images sharing the base (default 4)")
    ap.add_argument("--base-mib", type=int, default=150, help="the base layer's size (default 150 MiB)")
    ap.add_argument("--rounds", type=int, default=15, help="sandbox starts of each kind (default 15)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        ap.error("needs root: the layers format's whiteouts are device nodes, and bwrap's layers overlay mounts")
    if args.images < 2 or args.rounds < 1:
        ap.error("--images must be at least 2 (a base is shared by two or more) and --rounds at least 1")

    def log(msg: str) -> None:
        if not args.json:
            print(msg, flush=True)

    layouts = make_images(args.dir / f"images-{args.images}x{args.base_mib}mib", args.images, args.base_mib, log)
    with tempfile.TemporaryDirectory(prefix="image-bench-", dir=args.dir) as tmp:
        cache = ImageCache(Path(tmp) / "cache")
        log(f"(a) storage: {args.images} images, built as rootfs and as layers ...")
        disk = storage(layouts, cache)
        log(f"(b) start to first exec, {args.rounds} rounds each, interleaved ...")
        (Path(tmp) / "scratch").mkdir()
        start = asyncio.run(start_times(cache, layouts[0], args.rounds, str(Path(tmp) / "scratch")))
    out = {"storage": disk, "start": start}
    if args.json:
        print(json.dumps(out))
        return 0
    mib = 2**20
    print(f"\n(a) {disk['images']} images on one base, on disk:\n"
          f"    layers (figure)      {disk['figure_layers_bytes'] / mib:8.1f} MiB\n"
          f"    flattened (baseline) {disk['baseline_flattened_bytes'] / mib:8.1f} MiB   ratio {disk['ratio']:.3f}\n"
          f"    unique layers' bytes {disk['unique_layer_bytes'] / mib:8.1f} MiB   layers / unique "
          f"{disk['layers_over_unique']:.3f} (target <= {TARGET_STORAGE}: "
          f"{'met' if disk['meets_target'] else 'NOT met'})")
    print(f"(b) start to first exec, p50 of {start['rounds']}:\n"
          f"    layers (figure)      {start['figure_layers_p50_s'] * 1000:8.1f} ms\n"
          f"    flattened (baseline) {start['baseline_flattened_p50_s'] * 1000:8.1f} ms   ratio {start['ratio']:.3f} "
          f"(target <= {TARGET_START}: {'met' if start['meets_target'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
