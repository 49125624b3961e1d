"""The host's process table, as the fault tests read it."""

import subprocess


def orphans_named(comm: str) -> set[int]:
    """The pids of the processes of this name whose parent is pid 1: outliving the process that owned them."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,comm="], capture_output=True, text=True).stdout
    rows = (line.split(None, 2) for line in out.splitlines())
    return {int(row[0]) for row in rows if len(row) == 3 and row[1] == "1" and row[2].strip() == comm}
