"""The Slurm substrate of agentrl-hpc: run directory, ledger, buffer, registry.

Knows nothing about RL or SWE tasks; `agentrl` builds on it.
"""
