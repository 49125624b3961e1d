"""The `agentrl` command. Each subcommand has --help."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

CLUSTER_SCRIPT = Path(__file__).resolve().parents[1] / "slurm" / "local-cluster" / "cluster.sh"


def _cluster(args: argparse.Namespace) -> int:
    if not CLUSTER_SCRIPT.exists():
        print(f"agentrl cluster needs a source checkout of agentrl-hpc ({CLUSTER_SCRIPT} is missing)",
              file=sys.stderr)
        return 2
    return subprocess.call(["bash", str(CLUSTER_SCRIPT), args.action])


def _ledger_status(args: argparse.Namespace) -> int:
    from hpc.ledger import Ledger, LedgerError
    from hpc.records import RecordError

    root = Path(args.path)
    if (root / "run.yaml").exists():
        root = root / "ledger"
    if not (root / "ledger.json").exists():
        print(f"{root} holds no ledger (no ledger.json): pass a run directory or its ledger/", file=sys.stderr)
        return 2
    try:
        led = Ledger(root)
        rows = [asdict(led.status(r)) for r in led.rollouts()]
    except (LedgerError, RecordError) as e:
        print(e, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'rollout':>7} {'gen':>4} {'closed':>6} {'total':>6} {'done':>6} {'claimed':>7} "
          f"{'pending':>7} {'failed':>6}  complete groups")
    for r in rows:
        print(f"{r['rollout_id']:>7} {r['generation']:>4} {str(r['closed']):>6} {r['total']:>6} "
              f"{r['committed']:>6} {r['claimed']:>7} {r['pending']:>7} {r['failed']:>6}  "
              f"{len(r['complete_groups'])}")
    return 0


def _add_convert(sub) -> None:
    from .swe import harbor

    conv = sub.add_parser("convert", help="convert task datasets to JSONL prompt data")
    conv_sub = conv.add_subparsers(dest="convert_command", required=True)
    h = conv_sub.add_parser("harbor", help="Harbor task directories -> one JSONL line per task",
                            description=harbor.__doc__)
    harbor.add_arguments(h)
    h.set_defaults(func=harbor.run)


def _add_images_parser(sub) -> None:
    from .swe.environments import add_arguments, run

    img = sub.add_parser("images", help="turn task images into rootfs directories or SIFs, in a cache",
                         description="Build task images (OCI layouts, docker/oci-archives, registry references, and "
                                     "the Dockerfiles of tasks) into a content-addressed cache; see "
                                     "agentrl/swe/environments.py.")
    img_sub = img.add_subparsers(dest="images_command", required=True)
    b = img_sub.add_parser("build", help="build images into the cache and print their paths")
    add_arguments(b)
    b.set_defaults(func=run)


def _add_adapter_parser(sub) -> None:
    from .adapter import serve

    ad = sub.add_parser("adapter", help="the model adapter that agent CLIs talk to",
                        description="Anthropic and OpenAI endpoints over SGLang /generate, recording "
                                    "token-exact trajectories; see docs/adapter.md.")
    ad_sub = ad.add_subparsers(dest="adapter_command", required=True)
    s = ad_sub.add_parser("serve", help="run the adapter stand-alone", description=serve.__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_arguments(s)
    s.set_defaults(func=serve.run)


def _add_train_parser(sub) -> None:
    from .train import cli as train_cli

    t = sub.add_parser("train", help="the GRPO trainer role (one process per rank)", description=train_cli.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    train_cli.add_arguments(t)
    t.set_defaults(func=train_cli.run)

    from .train import sft
    s = sub.add_parser("sft", help="fine-tune a model on recorded samples (the warm start before RL, or distillation)",
                       description=sft.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sft.add_arguments(s)
    s.set_defaults(func=sft.run)


def _add_pool_parser(sub) -> None:
    from .rollout import cli as pool_cli

    p = sub.add_parser("pool", help="the rollout pool role (one worker per CPU node)", description=pool_cli.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    pool_cli.add_arguments(p)
    p.set_defaults(func=pool_cli.run)


def _add_serve_parser(sub) -> None:
    from . import serve_cli

    s = sub.add_parser("serve", help="the inference role: one model server per task (SGLang or the CPU stand-in)",
                       description=serve_cli.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve_cli.add_arguments(s)
    s.set_defaults(func=serve_cli.run)


def _add_report_parser(sub) -> None:
    from .report import render

    r = sub.add_parser("report", help="a run's metrics and eval results as report.md with PNG plots",
                       description=render.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    render.add_arguments(r)
    r.set_defaults(func=render.run)


def _add_eval_parser(sub) -> None:
    from .eval import cli as eval_cli

    e = sub.add_parser("eval", help="score checkpoints: one, or each of a run as it lands (--watch)",
                       description=eval_cli.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    eval_cli.add_arguments(e)
    e.set_defaults(func=eval_cli.run)


def _add_tasks_parser(sub) -> None:
    t = sub.add_parser("tasks", help="generate a task set, or check one before training on it")
    t_sub = t.add_subparsers(dest="tasks_command", required=True)
    c = t_sub.add_parser("check", help="oracle (solution) and no-op runs of each task, in real sandboxes; "
                                       "with --hacks, known reward hacks too",
                         description="Each task's solution must pass (reward 1) and its untouched repository "
                                     "must fail (reward 0); tasks that do not are flagged (exit 1). With --hacks, "
                                     "known reward hacks run as the agent and are graded as the pool grades "
                                     "them: each must earn reward 0, and a hack that earns more is flagged "
                                     "(task, hack, mode, reward; exit 1).")
    c.add_argument("paths", nargs="*", help="Harbor task directories, directories of them, or JSONL prompt files")
    c.add_argument("--concurrency", type=int, default=2, help="tasks checked at once (default 2)")
    c.add_argument("--scratch", help="node-local directory for sandbox layers (default: the temp dir)")
    c.add_argument("--runtime", choices=("bwrap", "apptainer"), default="bwrap", help="sandbox runtime (default bwrap)")
    c.add_argument("--image-cache", metavar="DIR",
                   help="the image cache where tasks' images were built (`agentrl images build`)")
    c.add_argument("--json", action="store_true", help="end with one JSON object of the results")
    c.add_argument("--hacks", action="store_true",
                   help="also run the default set of known reward hacks against each task's grader")
    c.add_argument("--hacks-only", action="store_true", help="run the hacks but not the oracle and no-op")
    c.add_argument("--hack", action="append", metavar="NAME",
                   help="run this hack (repeatable; implies --hacks; `--hack list` names them all)")
    c.add_argument("--grading", choices=("same", "isolated", "both"), default="both",
                   help="how hack runs are graded: in the agent's sandbox, with the patch in a fresh one, or "
                        "both (default)")

    def run(args: argparse.Namespace) -> int:
        from .swe.check import main as check_main
        if args.hack == ["list"]:
            from .swe.hacks import describe
            print(describe())
            return 0
        if not args.paths:
            c.error("name the tasks: Harbor task directories, directories of them, or JSONL prompt files")
        if args.concurrency < 1:
            c.error("--concurrency must be at least 1")
        return check_main(args)
    c.set_defaults(func=run)

    from .swe import generate
    g = t_sub.add_parser("generate", help="write N Harbor tasks of a family, procedurally and reproducibly",
                         description=generate.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    generate.add_arguments(g)
    g.set_defaults(func=generate.run)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentrl", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("cluster", help="a real Slurm cluster on this machine, for tests and trials",
                       description="munge + slurmctld + slurmd for nodes gpu1 (4 GPUs), cpu1, cpu2. "
                                   "State lives in $AGENTRL_CLUSTER_DIR "
                                   "(default ~/.local/state/agentrl/local-cluster).")
    c.add_argument("action", choices=["up", "down", "status", "env"],
                   help="up: start and wait for idle nodes (idempotent); down: stop what up started; "
                        "status: daemons and sinfo; env: the SLURM_CONF export line")
    c.set_defaults(func=_cluster)

    led = sub.add_parser("ledger", help="inspect a run's rollout ledger")
    led_sub = led.add_subparsers(dest="ledger_command", required=True)
    st = led_sub.add_parser("status", help="progress of every rollout in the ledger")
    st.add_argument("path", help="a run directory, or its ledger/ directory")
    st.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    st.set_defaults(func=_ledger_status)

    from .launch_commands import add_parsers
    add_parsers(sub)
    _add_convert(sub)
    _add_images_parser(sub)
    _add_tasks_parser(sub)
    _add_adapter_parser(sub)
    _add_train_parser(sub)
    _add_pool_parser(sub)
    _add_serve_parser(sub)
    _add_report_parser(sub)
    _add_eval_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


def entry() -> None:
    """The console script. Only a process of its own may change how it takes SIGPIPE."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `agentrl status RUN | head` ends quietly
    sys.exit(main())


if __name__ == "__main__":
    entry()
