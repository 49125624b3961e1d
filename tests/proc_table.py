"""The host's process table, as the fault tests read it."""

import subprocess


def named(comm: str) -> int:
    """How many processes `ps -o comm` shows under this name (the sandbox supervisors name themselves)."""
    out = subprocess.run(["ps", "-eo", "comm="], capture_output=True, text=True).stdout
    return sum(line.strip() == comm for line in out.splitlines())
