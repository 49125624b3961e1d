"""The benchmarks, run from the repository root as modules: `python -m benchmarks.ledger_bench --json`."""
