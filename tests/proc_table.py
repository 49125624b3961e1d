"""The host's process table, as the fault tests read it."""

import subprocess


def named(comm: str) -> int:
    """How many processes `ps -o comm` shows under this name (the sandbox supervisors name themselves)."""
    return len(pids_named(comm))


def pids_named(comm: str) -> set[int]:
    """The pids of the processes `ps -o comm` shows under this name."""
    out = subprocess.run(["ps", "-eo", "pid=,comm="], capture_output=True, text=True).stdout
    return {int(pid) for pid, _, name in (line.strip().partition(" ") for line in out.splitlines())
            if name.strip() == comm}
