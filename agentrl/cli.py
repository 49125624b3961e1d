"""The `agentrl` command. Each subcommand has --help."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One subcommand: `path` as typed ("tasks check"), the module that implements it (its docstring is the
    description; it has `add_arguments(parser)` and `run(args) -> exit status`), the one-line help, and
    whether it is a role of a launched run (a role logs at INFO to stderr)."""

    path: str
    module: str
    help: str
    role: bool = False


# Commands with a space in their path sit under a group; each group's one-line help.
GROUPS = {
    "ledger": "inspect a run's rollout ledger",
    "convert": "convert task datasets to JSONL prompt data",
    "images": "turn task images into rootfs directories or SIFs, in a cache",
    "tasks": "generate a task set, or check one before training on it",
    "adapter": "the model adapter that agent CLIs talk to",
}

# Every command, in the order --help lists them: the one place that says where each is implemented.
COMMANDS = (
    Command("cluster", "agentrl.commands.cluster", "a real Slurm cluster on this machine, for tests and trials"),
    Command("ledger status", "agentrl.commands.ledger", "progress of every rollout in the ledger"),
    Command("launch", "agentrl.commands.launch", "launch a run's roles from a config"),
    Command("status", "agentrl.commands.status", "a run's launch state: roles, restarts, exit codes"),
    Command("stop", "agentrl.commands.stop", "stop a run: scancel its jobs, or signal its local driver"),
    Command("convert harbor", "agentrl.commands.convert_harbor", "Harbor task directories -> one JSONL line per task"),
    Command("images build", "agentrl.commands.images_build", "build images into the cache and print their paths"),
    Command("tasks check", "agentrl.commands.tasks_check", "oracle (solution) and no-op runs of each task, in "
            "real sandboxes; with --hacks, known reward hacks too"),
    Command("tasks generate", "agentrl.commands.tasks_generate",
            "write N Harbor tasks of a family, procedurally and reproducibly"),
    Command("adapter serve", "agentrl.commands.adapter_serve", "run the adapter stand-alone"),
    Command("train", "agentrl.commands.train", "the GRPO trainer role (one process per rank)", role=True),
    Command("sft", "agentrl.commands.sft",
            "fine-tune a model on recorded samples (the warm start before RL, or distillation)"),
    Command("pool", "agentrl.commands.pool", "the rollout pool role (one worker per CPU node)", role=True),
    Command("serve", "agentrl.commands.serve",
            "the inference role: one model server per task (SGLang or the CPU stand-in)", role=True),
    Command("report", "agentrl.commands.report", "a run's metrics and eval results as report.md with PNG plots"),
    Command("view", "agentrl.commands.view",
            "a run's or an eval's trajectories as a static HTML site (--serve to serve it)"),
    Command("eval", "agentrl.commands.eval", "score checkpoints: one, or each of a run as it lands (--watch)",
            role=True),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl", description=__doc__)
    top = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for command in COMMANDS:
        group, _, name = command.path.rpartition(" ")
        if group and group not in groups:
            g = top.add_parser(group, help=GROUPS[group], description=GROUPS[group])
            groups[group] = g.add_subparsers(dest=f"{group}_command", required=True)
        module = importlib.import_module(command.module)
        p = (groups[group] if group else top).add_parser(
            name, help=command.help, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(handler=module.run, is_role=command.role)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.is_role:
        from .logs import setup_logging
        setup_logging()
    return args.handler(args)


def entry() -> None:
    """The console script. Only a process of its own may change how it takes SIGPIPE."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `agentrl status RUN | head` ends quietly
    sys.exit(main())


if __name__ == "__main__":
    entry()
