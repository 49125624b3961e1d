"""What a launch leaves on disk: RUN/launch/run.json and one record per task.

    RUN/launch/plan.json            the validated plan
    RUN/launch/run.json             executor, Slurm job id, state of the run
    RUN/launch/driver-<name>.json   state of each submitit driver (one job per partition)
    RUN/launch/end.json             how the run ended: written once, by whoever ended it
    RUN/launch/tasks/<role>-<i>.json  state, restarts, exit code of each task
    RUN/launch/heartbeats/<role>-<i>  a watched role's liveness file (hpc.liveness), by its task wrapper
    RUN/launch/config-history/<n>.yaml  run.yaml before each accepted config change (RunLayout.amend_config)

Each file has one writer (the driver or the task's own wrapper) and is replaced atomically.
"""

from __future__ import annotations

from typing import Literal

from ..records import Record, create_record, parse_record, read_record, write_record
from ..runlayout import RunLayout

RunState = Literal["submitted", "running", "finished", "failed", "stopped", "requeued"]


class TaskRecord(Record):
    kind: Literal["task"] = "task"
    role: str
    index: int
    state: Literal["running", "exited"]
    restarts: int = 0
    started: float
    ended: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    pid: int | None = None
    pgid: int | None = None
    node: str = ""
    command: list[str] = []


class LaunchRecord(Record):
    kind: Literal["launch"] = "launch"
    executor: Literal["sbatch", "submitit", "local"]
    state: RunState
    job_id: str | None = None
    driver_pid: int | None = None
    message: str = ""
    updated: float


class EndRecord(Record):
    kind: Literal["end"] = "end"
    state: RunState
    exit_code: int
    message: str
    ended: float


def write_task_record(layout: RunLayout, rec: TaskRecord) -> None:
    path = layout.task_record_path(rec.role, rec.index)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_record(path, rec, fsync=False)


def read_task_records(layout: RunLayout) -> list[TaskRecord]:
    d = layout.task_records_dir
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("*.json")):
        try:
            out.append(parse_record(p, p.read_bytes(), TaskRecord))
        except FileNotFoundError:
            continue
    return sorted(out, key=lambda r: (r.role, r.index))


def write_launch_record(layout: RunLayout, rec: LaunchRecord, name: str = "run") -> None:
    layout.launch_dir.mkdir(parents=True, exist_ok=True)
    write_record(layout.launch_dir / f"{name}.json", rec)


def read_launch_record(layout: RunLayout, name: str = "run") -> LaunchRecord | None:
    path = layout.launch_dir / f"{name}.json"
    return read_record(path, LaunchRecord) if path.exists() else None


def read_driver_records(layout: RunLayout) -> dict[str, LaunchRecord]:
    return {p.stem.removeprefix("driver-"): read_record(p, LaunchRecord)
            for p in sorted(layout.launch_dir.glob("driver-*.json"))}


def end_run(layout: RunLayout, state: RunState, exit_code: int, message: str) -> EndRecord:
    """Record how the run ended; the first to end it wins. Returns the record that stands."""
    import time

    path = layout.end_path
    create_record(path, EndRecord(state=state, exit_code=exit_code, message=message, ended=time.time()))
    return read_record(path, EndRecord)


def read_end(layout: RunLayout) -> EndRecord | None:
    path = layout.end_path
    return read_record(path, EndRecord) if path.exists() else None


def final_state(layout: RunLayout) -> str | None:
    """How the run ended (finished, failed, stopped), or None while it has not: the driver's end
    record (local, submitit), else the state the sbatch script wrote when its trainer ended."""
    end = read_end(layout)
    if end is not None:
        return end.state
    rec = read_launch_record(layout)
    return rec.state if rec is not None and rec.state in ("finished", "failed", "stopped") else None


def still_running(layout: RunLayout) -> str | None:
    """Why the run's last launch may still be running (its local driver is alive, its jobs are in
    Slurm's queue), or None if it has ended. A local driver on another host is not seen."""
    import os

    from .. import slurm

    rec = read_launch_record(layout)
    if rec is None or final_state(layout) is not None:
        return None
    if rec.job_id:
        queued = slurm.queued(rec.job_id)
        return f"its job(s) {', '.join(queued)} are still in Slurm's queue" if queued else None
    if rec.driver_pid:
        try:
            os.kill(rec.driver_pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return f"its local driver (pid {rec.driver_pid}) is still running"
    return None


def unit_exit_code(records: list[TaskRecord], role: str, restarts: int, reported: int) -> int:
    """How a distributed unit (every task of `role`) ended: the exit of its task that failed first
    on its own, at this restart count; else the code its launcher reported.

    When one rank fails, its launcher (srun --kill-on-bad-exit, or the local driver) stops the
    others, and srun reports the highest code of all, so a rank we stopped (143) would hide the
    rank that failed (say 3): the tasks' own records say which came first.
    """
    own = [(r.ended, r.exit_code) for r in records if r.role == role and r.restarts == restarts
           and r.state == "exited" and r.exit_code and r.signal is None and r.ended is not None]
    return min(own, key=lambda ended_code: ended_code[0])[1] if own else reported


def main(argv: list[str] | None = None) -> int:
    """How an sbatch script records its run's state, `python -m hpc.launch.state RUN STATE [MESSAGE]`,
    and learns how a distributed unit ended, `... RUN exit-code ROLE RESTARTS RC` (prints the code)."""
    import argparse
    import os
    import time

    from ..environment import SlurmEnv

    ap = argparse.ArgumentParser(prog="python -m hpc.launch.state")
    ap.add_argument("run")
    ap.add_argument("state", choices=["running", "finished", "failed", "stopped", "requeued", "exit-code"])
    ap.add_argument("message", nargs="*", default=[])
    args = ap.parse_args(argv)
    layout = RunLayout.open(args.run)
    if args.state == "exit-code":
        if len(args.message) != 3 or not all(a.lstrip("-").isdigit() for a in args.message[1:]):
            ap.error("exit-code takes ROLE RESTARTS RC, e.g. `exit-code trainer 0 143`")
        role, restarts, rc = args.message[0], int(args.message[1]), int(args.message[2])
        print(unit_exit_code(read_task_records(layout), role, restarts, rc))
        return 0
    args.message = " ".join(args.message)
    write_launch_record(layout, LaunchRecord(executor="sbatch", state=args.state,
                                             job_id=SlurmEnv.from_environ().job_id, driver_pid=os.getppid(),
                                             message=args.message, updated=time.time()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
