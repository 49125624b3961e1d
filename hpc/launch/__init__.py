"""Launching a run's roles: one plan, three executors (sbatch het job, submitit, local processes)."""
