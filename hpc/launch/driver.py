"""The driver: starts every unit of a plan, watches it, applies restart policies.

The one restart implementation, for every executor: a local process (the local executor), or
inside a Slurm allocation, starting units as concurrent `srun --exact` steps: the submitit job
(AllocationDriver), or the body of the sbatch het-job script (`python -m hpc.launch.driver RUN <
PLAN`, `main` below). Its state and every task's state are on disk (hpc.launch.state), so
`agentrl status RUN` works from any host.

Before a time limit Slurm sends SIGUSR2 signal_lead_s ahead: the fail-run roles checkpoint (for
checkpoint_grace_s at most), every unit is stopped (stop_grace_s, then SIGKILL), and the job
requeues: submitit does it for its jobs, the driver of an sbatch job with `scontrol requeue`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .. import slurm
from ..environment import AllocationEnv
from ..procs import kill_group
from ..runlayout import RunLayout
from .plan import CONFIG_ERROR_EXIT, Plan, RestartPolicy
from .state import LaunchRecord, RunState, end_run, read_end, read_task_records, unit_exit_code, write_launch_record
from .steps import Unit, start_local, start_srun, units

POLL_S = 0.2


@dataclass
class Running:
    unit: Unit
    procs: list[subprocess.Popen]
    restarts: int = 0
    exit_code: int | None = None
    restart_at: float | None = None   # when a restart is due
    done: bool = False

    def poll(self) -> int | None:
        """The unit's exit code once every process has exited (first failure wins), else None."""
        codes = [p.poll() for p in self.procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed and None in codes:
            # One rank failed: the others would wait for it forever.
            for p in self.procs:
                if p.poll() is None:
                    kill_group(p.pid, grace_s=5)
            codes = [p.wait() for p in self.procs]
        exited = [c for c in codes if c is not None]
        if len(exited) < len(codes):
            return None
        bad = [c for c in exited if c != 0]
        return (bad[0] if bad[0] >= 0 else 128 - bad[0]) if bad else 0


@dataclass
class Driver:
    plan: Plan
    layout: RunLayout
    executor: Literal["local", "submitit", "sbatch"]
    python: str
    job_id: str | None = None
    nodes_by_partition: dict[str, list[str]] = field(default_factory=dict)
    clock: Callable[[], float] = time.time
    _stop_reason: str | None = field(default=None, init=False)
    _requeue_at: float | None = field(default=None, init=False)    # sbatch: when SIGUSR2 came
    _running: dict[str, Running] = field(default_factory=dict, init=False)

    def _gpu_ids(self) -> dict[str, list[int]]:
        """Locally, GPUs are handed out in plan order: disjoint by construction."""
        out, nxt = {}, 0
        for name, role in self.plan.roles.items():
            n = role.tasks * role.gpus_per_task
            out[name] = list(range(nxt, nxt + n))
            nxt += n
        return out

    def _start(self, unit: Unit, restarts: int) -> list[subprocess.Popen]:
        role = self.plan.roles[unit.role]
        log_dir = self.layout.logs_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        run_dir = str(self.layout.root)
        if self.executor == "local":
            ids = self._gpu_ids()[unit.role]
            if unit.index is not None:
                ids = ids[unit.index * role.gpus_per_task:(unit.index + 1) * role.gpus_per_task]
            return start_local(unit, role, gpu_ids=ids, python=self.python, run_dir=run_dir, log_dir=log_dir,
                               restarts=restarts)
        comp = self.plan.component_of(unit.role)
        first = comp.offsets[unit.role]
        nodes = self.nodes_by_partition.get(role.partition, [])[first:first + role.nodes]
        if unit.index is None:
            nodelist = ",".join(nodes) or None
        else:
            nodelist = nodes[unit.index % role.nodes] if nodes else None
        # An sbatch job is one het job, a component per partition; a submitit job holds one partition.
        het_group = comp.index if self.executor == "sbatch" and len(self.plan.components()) > 1 else None
        return start_srun(unit, role, nodelist=nodelist, het_group=het_group, python=self.python, run_dir=run_dir,
                          log_dir=log_dir, restarts=restarts)

    def _record(self, state: RunState, message: str = "") -> None:
        # Locally the driver is the run; under submitit there is one driver per job.
        name = "driver-" + self.plan.name if self.executor == "submitit" else "run"
        write_launch_record(self.layout, LaunchRecord(
            executor=self.executor, state=state, job_id=self.job_id, driver_pid=os.getpid(),
            message=message, updated=self.clock()), name=name)

    def _fail_run_procs(self) -> list[subprocess.Popen]:
        return [p for r in self._running.values()
                if self.plan.roles[r.unit.role].restart.policy is RestartPolicy.FAIL_RUN for p in r.procs]

    def _signal_fail_run(self, signum: int) -> None:
        # Each unit is its own process group: srun passes the signal on to its step's tasks,
        # and a local task wrapper to its command.
        for p in self._fail_run_procs():
            try:
                os.killpg(p.pid, signum)
            except ProcessLookupError:
                pass

    def _signal_fail_run_steps(self, signum: int) -> None:
        """sbatch: Slurm signalled the batch step alone (`--signal=B:`); pass it to the fail-run roles' steps."""
        fail_run = {n for n, r in self.plan.roles.items() if r.restart.policy is RestartPolicy.FAIL_RUN}
        steps = [step for step, name in slurm.job_steps(str(self.job_id)) if name in fail_run]
        if steps:
            slurm.scancel(steps, signal=signal.Signals(signum).name.removeprefix("SIG"), check=False)

    def _on_signal(self, signum, _frame) -> None:
        if signum == signal.SIGUSR2:
            # Slurm's warning before a time limit or preemption: the trainer checkpoints.
            if self.executor == "sbatch":
                self._requeue_at = time.monotonic()
                self._signal_fail_run_steps(signal.SIGUSR2)
            else:
                self._signal_fail_run(signal.SIGUSR2)
            return
        self._stop_reason = f"stopped by {signal.Signals(signum).name}"

    def checkpoint_and_stop(self) -> None:
        """Before a requeue: fail-run roles checkpoint (SIGUSR2, then the grace), then every unit stops."""
        self._signal_fail_run(signal.SIGUSR2)
        deadline = time.monotonic() + self.plan.checkpoint_grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in self._fail_run_procs()):
            time.sleep(POLL_S)
        self._stop_all()
        self._record("requeued", "checkpointed after SIGUSR2; the job requeues")

    def run(self) -> int:
        """Run the plan until the trainer ends, a role fails for good, or a signal stops it."""
        # Under submitit, SIGUSR2 is submitit's: it calls AllocationDriver.checkpoint, then requeues.
        owned = (signal.SIGTERM, signal.SIGINT) if self.executor == "submitit" else \
            (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)
        for sig in owned:
            signal.signal(sig, self._on_signal)
        self._record("running")
        for unit in units(self.plan):
            self._running[unit.key] = Running(unit, self._start(unit, 0))
        try:
            state, code, message = self._watch()
        finally:
            self._stop_all()
        if state == "requeued":           # sbatch: the run goes on when the job starts again
            self._record("requeued", message)
            slurm.requeue(str(self.job_id))
            return 0
        end = end_run(self.layout, state, code, message)
        self._record(end.state, end.message)
        return end.exit_code

    def _watch(self) -> tuple[RunState, int, str]:
        while True:
            if self._stop_reason:
                return "stopped", 143, self._stop_reason
            if self._requeue_at is not None:    # units exit now because they checkpoint: no restarts
                waited = time.monotonic() - self._requeue_at
                if waited >= self.plan.checkpoint_grace_s or not any(p.poll() is None for p in self._fail_run_procs()):
                    return "requeued", 0, f"checkpointed after SIGUSR2 ({waited:.0f} s); the job requeues"
                time.sleep(POLL_S)
                continue
            end = read_end(self.layout)
            if end is not None:   # another driver of this run (another job) ended it
                return end.state, end.exit_code, end.message
            now = self.clock()
            for r in self._running.values():
                if r.done:
                    continue
                if r.restart_at is not None:
                    if now >= r.restart_at:
                        r.restart_at, r.exit_code = None, None
                        r.procs = self._start(r.unit, r.restarts)
                    continue
                rc = r.poll()
                if rc is None:
                    continue
                if rc and r.unit.index is None:
                    rc = unit_exit_code(read_task_records(self.layout), r.unit.role, r.restarts, rc)
                r.exit_code = rc
                restart = self.plan.roles[r.unit.role].restart
                what = f"{r.unit.key} exited with {rc}"
                if restart.policy is RestartPolicy.FAIL_RUN:
                    if rc == 0:
                        return "finished", 0, f"{what}: the run is complete"
                    return "failed", rc, f"{what}: a fail-run role ends the run"
                if restart.policy is RestartPolicy.IGNORE:
                    r.done = True
                elif rc == CONFIG_ERROR_EXIT:
                    return "failed", rc, f"{what}, a configuration error: not restarted (its log says what to fix)"
                elif r.restarts < restart.max_restarts:
                    r.restarts += 1
                    r.restart_at = now + restart.backoff_s
                else:
                    return "failed", rc or 1, f"{what} after {r.restarts} restarts (max_restarts reached)"
            if all(r.done for r in self._running.values()):
                return "finished", 0, "every role ended"
            time.sleep(POLL_S)

    def _stop_all(self) -> None:
        grace = self.plan.stop_grace_s
        if self.job_id and self.executor != "local":
            # SIGTERM straight to every step's tasks: srun itself, signalled, kills its step hard,
            # and the task wrappers would get no chance to stop their commands and record the exit.
            slurm.scancel([self.job_id], signal="TERM", check=False)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(
                    p.poll() is None for r in self._running.values() for p in r.procs):
                time.sleep(0.2)
        for r in self._running.values():
            for p in r.procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
        deadline = time.monotonic() + grace
        for r in self._running.values():
            for p in r.procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    kill_group(p.pid, grace_s=0)
                    p.wait()
        if self.executor == "local":
            # A wrapper killed hard leaves its command's group: the task record names it.
            for rec in read_task_records(self.layout):
                if rec.pgid:
                    kill_group(rec.pgid, grace_s=2)


def nodes_by_partition(plan: Plan, allocation: list[str]) -> dict[str, list[str]]:
    """The allocation's nodes that belong to each partition of the plan, in allocation order."""
    return {name: [n for n in allocation if n in part.nodes] for name, part in plan.partitions.items()}


class AllocationDriver:
    """The submitit job: a Driver inside the allocation, checkpointable so that submitit
    requeues it on SIGUSR2 (time limit or preemption) and it resumes from the run directory."""

    def __init__(self) -> None:
        self.driver: Driver | None = None

    def __call__(self, plan_json: str, run_dir: str, python: str) -> int:
        from ..environment import SlurmEnv
        from .distenv import expand_hostlist

        plan = Plan.model_validate_json(plan_json)
        allocation = expand_hostlist(AllocationEnv.from_environ().nodelist)
        self.driver = Driver(plan, RunLayout.open(run_dir), "submitit", python,
                             job_id=SlurmEnv.from_environ().job_id,
                             nodes_by_partition=nodes_by_partition(plan, allocation))
        code = self.driver.run()
        if code != 0:
            raise SystemExit(code)
        return code

    def checkpoint(self, plan_json: str, run_dir: str, python: str):
        import submitit

        if self.driver is not None:
            self.driver.checkpoint_and_stop()
        return submitit.helpers.DelayedSubmission(AllocationDriver(), plan_json, run_dir, python)


def het_nodes(plan: Plan, allocation: AllocationEnv) -> dict[str, list[str]]:
    """An sbatch het job's nodes by partition: component i's are its het group i's."""
    from .distenv import expand_hostlist

    comps = plan.components()
    if len(comps) == 1:
        return {comps[0].partition: expand_hostlist(allocation.nodelist)}
    return {c.partition: expand_hostlist(allocation.het_nodelists.get(c.index, "")) for c in comps}


def main(argv: list[str] | None = None) -> int:
    """The body of an sbatch script: `python -m hpc.launch.driver RUN_DIR < PLAN.yaml` (hpc.launch.sbatch)."""
    import argparse

    import yaml

    from ..environment import SlurmEnv
    from .plan import PlanError, load_plan

    ap = argparse.ArgumentParser(prog="python -m hpc.launch.driver", description=main.__doc__)
    ap.add_argument("run_dir", type=Path)
    args = ap.parse_args(argv)
    try:
        plan = load_plan(yaml.safe_load(sys.stdin.read()))
        layout = RunLayout.open(args.run_dir)
    except (PlanError, yaml.YAMLError, OSError, ValueError) as e:
        print(f"agentrl: {e}", file=sys.stderr)
        return 2
    job = SlurmEnv.from_environ().job_id
    # One job is the whole run: an end record is an earlier launch's (a requeued job leaves none).
    layout.end_path.unlink(missing_ok=True)
    print(f"agentrl: job {job}, run directory {layout.root}, python {sys.executable}", flush=True)
    nodes = het_nodes(plan, AllocationEnv.from_environ())
    for c in plan.components():
        print(f"agentrl: component {c.index} (partition {c.partition}, roles {', '.join(c.roles)}): "
              f"nodes {' '.join(nodes.get(c.partition, []))}, {c.gpus_per_node} GPUs per node", flush=True)
    return Driver(plan, layout, "sbatch", sys.executable, job_id=job, nodes_by_partition=nodes).run()


if __name__ == "__main__":
    sys.exit(main())
