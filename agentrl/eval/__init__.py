"""Scoring checkpoints from the filesystem: one (`agentrl eval CHECKPOINT`) or each as it lands (`--watch RUN`)."""
