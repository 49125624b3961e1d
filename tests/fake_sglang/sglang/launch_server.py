"""`python -m sglang.launch_server ...` with SGLang's flag names, served by the project's CPU stand-in.

Put tests/fake_sglang (and the repository root) on PYTHONPATH. The flags are the ones
hpc.inference.sglang.launch_command emits, spelled as SGLang 0.5.12 spells them; an unknown flag
fails as it would in SGLang. FAKE_SGLANG_FAIL=MESSAGE prints MESSAGE and exits 3 before serving,
as a server that cannot start does.
"""

import argparse
import os
import sys

from hpc.inference import cpu_server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    ap.add_argument("--model-path", "--model", required=True)
    ap.add_argument("--tensor-parallel-size", "--tp-size", type=int, default=1)
    ap.add_argument("--data-parallel-size", "--dp-size", type=int, default=1)
    ap.add_argument("--mem-fraction-static", type=float)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--tool-call-parser")
    ap.add_argument("--reasoning-parser")
    ap.add_argument("--context-length", type=int)
    ap.add_argument("--weight-version", default="default")
    ap.add_argument("--skip-server-warmup", action="store_true")
    ap.add_argument("--enable-memory-saver", action="store_true")
    ap.add_argument("--random-seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"fake sglang: {vars(args)}", flush=True)
    if failure := os.environ.get("FAKE_SGLANG_FAIL"):
        print(failure, file=sys.stderr, flush=True)
        return 3
    return cpu_server.main(["--model", args.model_path, "--host", args.host, "--port", str(args.port),
                            "--weight-version", args.weight_version, "--random-seed", str(args.random_seed)])


if __name__ == "__main__":
    sys.exit(main())
