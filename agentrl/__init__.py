"""agentrl-hpc: RL for coding agents on Slurm clusters (the application on top of `hpc`)."""

__version__ = "0.1.0"
