"""Harbor task directories -> JSONL prompt data (the same as `agentrl convert harbor`).

    python tools/harbor_to_prompts.py HARBOR_TASKS/ --out prompts.jsonl [--on-error skip|fail]
"""

from __future__ import annotations

import argparse
import sys

from agentrl.commands import convert_harbor as harbor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harbor_to_prompts.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    harbor.add_arguments(p)
    return harbor.run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
