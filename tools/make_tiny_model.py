"""Build the tiny offline Qwen2-shaped model (tokenizer, chat template, random weights) into OUT_DIR.

    python tools/make_tiny_model.py OUT_DIR [--vocab-size N] [--seed S] [--hidden-size H] [--layers L]
                                    [--experts E [--experts-per-token K]] [--no-weights]

With --experts, a mixture of experts (Qwen3-MoE: every layer's MLP E experts, K of them per token).

Nothing is downloaded. Re-running with the same options is a no-op; OUT_DIR must be new, empty, or
already hold this tiny model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentrl.models import tiny


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make_tiny_model.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", metavar="OUT_DIR", type=Path, help="directory to create")
    p.add_argument("--vocab-size", type=int, default=4000, help="tokens, added tokens included (default 4000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    p.add_argument("--hidden-size", type=int, default=64, help="width, a multiple of 32 (default 64)")
    p.add_argument("--layers", type=int, default=2, help="transformer layers (default 2)")
    p.add_argument("--experts", type=int, default=0, help="experts per MoE layer; 0: a dense model (default)")
    p.add_argument("--experts-per-token", type=int, default=2, help="experts each token takes (default 2)")
    p.add_argument("--no-weights", dest="weights", action="store_false", help="write the tokenizer only")
    args = p.parse_args(argv)
    try:
        out = tiny.make_tiny_model(args.out_dir, vocab_size=args.vocab_size, seed=args.seed, weights=args.weights,
                                   hidden_size=args.hidden_size, layers=args.layers, experts=args.experts,
                                   experts_per_token=args.experts_per_token)
    except (ValueError, OSError) as e:
        print(f"make_tiny_model.py: error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
