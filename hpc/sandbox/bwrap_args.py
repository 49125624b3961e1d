"""bwrap's command-line grammar, as far as the sandbox needs to read its own command lines."""

from __future__ import annotations

from collections.abc import Iterator

ARITY = {"--bind": 2, "--ro-bind": 2, "--dev-bind": 2, "--symlink": 2, "--proc": 1, "--dev": 1, "--tmpfs": 1,
         "--dir": 1, "--hostname": 1, "--perms": 1, "--size": 1, "--info-fd": 1, "--cap-drop": 1, "--cap-add": 1,
         "--seccomp": 1, "--chdir": 1, "--setenv": 2, "--unsetenv": 1, "--uid": 1, "--gid": 1}
BINDS = ("--bind", "--ro-bind", "--dev-bind")


def options(argv: list[str]) -> Iterator[tuple[int, str, list[str]]]:
    """(index, flag, its arguments) for each option before `--` (argv[0] is bwrap itself)."""
    i = 1
    while i < len(argv) and argv[i] != "--":
        n = ARITY.get(argv[i], 0)
        yield i, argv[i], argv[i + 1:i + 1 + n]
        i += 1 + n
