"""A role program for launcher tests: reports what it was given, then behaves like its role.

trainer: all-reduces over gloo with its peers, then waits for RUN/probe/finish and ends the run;
         rank R exits 3 on RUN/probe/fail-R (the others wait to be stopped). SIGUSR2 makes it
         "checkpoint" (a marker file) and exit; started again with the marker there, it reports
         that it resumed.
others:  run until they are signalled (a SIGUSR2 leaves a marker: they should never get one),
         beating their heartbeat file (hpc.liveness) if the plan watches them.
"""

import json
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def report(path: Path, seen: dict) -> None:
    """Written whole or not at all: the test reads these while the role runs."""
    from hpc.fsio import write_atomic
    write_atomic(path, json.dumps(seen).encode(), fsync=False)


def main() -> int:
    run = Path(os.environ["AGENTRL_RUN_DIR"])
    role, index = os.environ["AGENTRL_ROLE"], os.environ["AGENTRL_TASK_INDEX"]
    out = run / "probe"
    out.mkdir(exist_ok=True)
    seen = {"role": role, "index": int(index), "pid": os.getpid(), "host": socket.gethostname(),
            "node": os.environ.get("SLURMD_NODENAME", "local"),
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "cpus": os.environ.get("SLURM_CPUS_PER_TASK"), "restarts": None}
    checkpoint = out / f"checkpoint-{role}-{index}"
    seen["resumed"] = checkpoint.exists()

    def on_usr2(*_):
        checkpoint.write_text("1")
        if role == "trainer":
            os._exit(0)
    signal.signal(signal.SIGUSR2, on_usr2)
    if role == "trainer":
        import torch
        import torch.distributed as dist

        from hpc.launch.distenv import init_process_group
        env = init_process_group("gloo", timeout=timedelta(seconds=60))
        t = torch.tensor([float(env.rank + 1)])
        dist.all_reduce(t)
        seen.update(rank=env.rank, world_size=env.world_size, allreduce=t.item())
        report(out / f"{role}-{index}.json", seen)
        while not (out / "finish").exists():
            if (out / f"fail-{env.rank}").exists():
                return 3
            time.sleep(0.1)
        dist.destroy_process_group()
        return 0
    report(out / f"{role}-{index}-{os.getpid()}.json", seen)
    from hpc.environment import RoleEnv
    from hpc.liveness import beat

    heartbeat = RoleEnv.from_environ().heartbeat_file
    while True:
        beat(heartbeat)
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
