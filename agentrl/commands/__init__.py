"""`agentrl` subcommands that belong to no other package: each module has `add_arguments(parser)` and
`run(args) -> exit status`; agentrl/cli.py lists every command and where it is implemented."""
