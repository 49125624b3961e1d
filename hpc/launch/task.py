"""One task of a role: `python -m hpc.launch.task --run RUN --role NAME [--index I] -- COMMAND...`.

Every executor runs each role task through this wrapper, so that every role,
whatever its command, is registered in services/ (as task_<role>), heartbeats, has a record of
its exit in RUN/launch/tasks/, and takes its process tree with it when it
goes. The command runs in its own process group; signals sent to the wrapper
(SIGTERM from scancel or the driver, SIGINT, SIGHUP) are forwarded to that
group; SIGUSR2 (before a time limit) only for roles that checkpoint. With
--liveness-s the command gets a heartbeat file (hpc.liveness) and is killed,
exit 124, once the file is older than that: alive but stuck is failed too.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

from ..environment import SlurmEnv
from ..liveness import HUNG_EXIT, silent_for
from ..procs import kill_group
from ..registry import Registry, task_role
from ..runlayout import RunLayout
from ..sandbox.linux import die_with_parent
from .state import TaskRecord, write_task_record

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)


def _prepare_child(checkpoint_signal: bool):
    def prepare() -> None:
        # If the wrapper is SIGKILLed, the command's leader goes too (Linux only).
        try:
            die_with_parent(signal.SIGKILL)
        except OSError:
            pass
        if not checkpoint_signal:
            # Slurm signals every process of every step before a time limit; only the roles
            # that checkpoint should act on it, the others would die of SIGUSR2's default.
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    return prepare


def own_script(name: str) -> str | None:
    """The launcher's Python (AGENTRL_PYTHON) runs this wrapper: a bare command name that is one of the
    scripts installed with it (beside it in its venv, or in its scheme's or user scheme's scripts
    directory) is that script, whether or not the directory is on PATH, so a role runs the same
    installation as the launcher."""
    if "/" in name:
        return None
    directories = [Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))]
    if f"{os.name}_user" in sysconfig.get_scheme_names():
        directories.append(Path(sysconfig.get_path("scripts", f"{os.name}_user")))
    for directory in directories:
        if (directory / name).is_file() and os.access(directory / name, os.X_OK):
            return str(directory / name)
    return None


def child_environment(base: dict[str, str], gpus: int, dist: dict[str, str] | None) -> dict[str, str]:
    env = dict(base)
    if gpus == 0:
        # A CPU role launched from a GPU node's batch script inherits its GPUs otherwise.
        env["CUDA_VISIBLE_DEVICES"] = ""
    if dist:
        env.update(dist)
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpc.launch.task", description=__doc__)
    ap.add_argument("--run", required=True, help="the run directory")
    ap.add_argument("--role", required=True)
    ap.add_argument("--index", type=int, default=None, help="task index (default: SLURM_PROCID)")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs this task was given (0: hide all)")
    ap.add_argument("--dist", action="store_true", help="set RANK, WORLD_SIZE, MASTER_ADDR, ... for torch")
    ap.add_argument("--restarts", type=int, default=0, help="how often this task was restarted before")
    ap.add_argument("--checkpoint-signal", action="store_true",
                    help="pass SIGUSR2 (time limit or preemption near) on to the command; else it is ignored")
    ap.add_argument("--heartbeat-s", type=float, default=5.0)
    ap.add_argument("--liveness-s", type=float, default=None,
                    help="kill the command (exit 124) once its heartbeat file is older than this")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given after --")
    command = [own_script(command[0]) or command[0], *command[1:]]

    slurm = SlurmEnv.from_environ()
    index = args.index if args.index is not None else (slurm.proc_id or 0)
    layout = RunLayout.open(args.run)
    dist = None
    if args.dist:
        from .distenv import detect
        found = detect(dict(os.environ))
        dist = found.to_environ() if found else None
    env = child_environment(dict(os.environ), args.gpus, dist)
    env.update(AGENTRL_RUN_DIR=str(layout.root), AGENTRL_ROLE=args.role, AGENTRL_TASK_INDEX=str(index))
    heartbeat = None
    if args.liveness_s is not None:
        heartbeat = layout.heartbeat_path(args.role, index)
        heartbeat.parent.mkdir(parents=True, exist_ok=True)
        heartbeat.touch()
        os.utime(heartbeat)          # a restart's bound counts from its own start
        env["AGENTRL_HEARTBEAT_FILE"] = str(heartbeat)
    shown = {k: env.get(k) for k in ("CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                      "MASTER_ADDR", "MASTER_PORT") if env.get(k) is not None}
    print(f"agentrl task {args.role}-{index} on {slurm.node or socket.gethostname()} "
          f"(restart {args.restarts}): {shown} run {layout.root}", file=sys.stderr, flush=True)

    registry = Registry(layout.services_dir)
    service = registry.register(task_role(args.role), index, host=socket.gethostname())
    record = TaskRecord(role=args.role, index=index, state="running", restarts=args.restarts,
                        started=time.time(), command=command, node=slurm.node or socket.gethostname())
    write_task_record(layout, record)

    stop = threading.Event()
    proc = subprocess.Popen(command, env=env, start_new_session=True,
                            preexec_fn=_prepare_child(args.checkpoint_signal))
    record = record.model_copy(update={"pid": proc.pid, "pgid": proc.pid})
    write_task_record(layout, record)

    def forward(signum, _frame):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass
    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.signal(signal.SIGUSR2, forward if args.checkpoint_signal else signal.SIG_IGN)

    def beat():
        nonlocal service
        while not stop.wait(args.heartbeat_s):
            service = registry.heartbeat(service)
    threading.Thread(target=beat, daemon=True).start()

    hung = False
    try:
        while True:
            try:
                rc = proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if heartbeat is not None and \
                        (silent := silent_for(heartbeat.stat().st_mtime, time.time())) > args.liveness_s:
                    print(f"agentrl task {args.role}-{index}: no heartbeat for {silent:.0f} s (liveness_s "
                          f"{args.liveness_s:g}): killed as hung", file=sys.stderr, flush=True)
                    kill_group(proc.pid, grace_s=0)      # SIGKILL: a stopped process acts on nothing else
                    rc, hung = proc.wait(), True
                    break
    finally:
        stop.set()
        kill_group(proc.pid)   # whatever the command left behind in its group
        registry.deregister(service)
    code = HUNG_EXIT if hung else rc if rc >= 0 else 128 - rc
    write_task_record(layout, record.model_copy(update={
        "state": "exited", "exit_code": code, "ended": time.time(),
        "signal": "hung" if hung else signal.Signals(-rc).name if rc < 0 else None}))
    return code


if __name__ == "__main__":
    sys.exit(main())
