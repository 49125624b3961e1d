"""Bootstrap torch.distributed from the launcher, all-reduce rank+1, print what each rank saw.

Run by tests/test_distenv.py under srun (Slurm env) and under mpirun (`--mpi`: from_mpi).
"""

import argparse
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, also when not installed

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hpc.launch.distenv import from_mpi, init_process_group  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mpi", action="store_true", help="bootstrap with from_mpi (under mpirun)")
    args = ap.parse_args()
    timeout = timedelta(seconds=60)
    if args.mpi:
        env = init_process_group("gloo", environ=from_mpi().to_environ(), timeout=timeout)
    else:
        env = init_process_group("gloo", timeout=timeout)
    t = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(t)
    print(f"rank={env.rank} world_size={dist.get_world_size()} local_rank={env.local_rank} "
          f"local_world_size={env.local_world_size} node_rank={env.node_rank} "
          f"master={env.master_addr}:{env.master_port} sum={t.item():g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
