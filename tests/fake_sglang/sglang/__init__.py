"""A stand-in for the `sglang` package: only `python -m sglang.launch_server`, served by hpc.inference.cpu_server."""
