"""`agentrl view RUN [--out DIR] [--serve PORT]`: a run's trajectories as a static site, to read in a browser.

RUN is a run directory, or one eval directory (RUN/eval/iter_<n>). The site goes to DIR (default:
RUN/view): an index of rollouts and evals (reward, pass@k, empty patches, drift), a page per rollout
or eval listing its attempts (a search box filters them), and a page per attempt: the conversation
turn by turn, the patch, the grader's output, and the samples' tokens with the trained ones marked.
It opens over file:// and needs no network. Run it again at any time (while the run trains, too):
only the pages whose files changed are rewritten, and new attempts are added.

With --serve PORT it then serves DIR on 127.0.0.1 (--host to change) until interrupted; from your
own machine, `ssh -L PORT:127.0.0.1:PORT LOGIN-NODE` and open http://127.0.0.1:PORT/.

With --weave, where the run's W&B is online (run.yaml's train.tracking, or --wandb-mode online for a run
trained offline), each attempt not logged before also goes to Weave as a call tree
(agentrl/view/weave_export.py; the extra agentrl-hpc[weave]); with --weave-tokens, each model turn's
token ids too.
Exit 2: RUN is neither a run nor an eval directory, or --weave cannot go ahead (W&B not online, no weave
package): then nothing is written.
"""

from __future__ import annotations

import argparse
import functools
import socket
import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN",
                   help="a run directory, or an eval directory (RUN/eval/iter_<n>)")
    p.add_argument("--out", type=Path, metavar="DIR", help="where the site goes (default: RUN/view)")
    p.add_argument("--rollout", type=int, action="append", metavar="N",
                   help="only this rollout's pages (repeatable; the index lists what was written before too)")
    p.add_argument("--eval", type=int, action="append", metavar="N", dest="eval_iter",
                   help="only eval iter_<N>'s pages (repeatable)")
    p.add_argument("--tokenizer", type=Path, metavar="DIR",
                   help="the tokenizer to decode tokens with (default: run.yaml's train.model)")
    p.add_argument("--serve", type=int, metavar="PORT", help="then serve the site over HTTP on PORT (0: any free one)")
    p.add_argument("--host", default="127.0.0.1", help="--serve: the address to bind (default: loopback only)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--weave", action="store_true",
                   help="also log each attempt not logged before to Weave, where the run's W&B is online "
                        "(run.yaml's train.tracking); needs the weave extra: pip install 'agentrl-hpc[weave]'")
    p.add_argument("--wandb-mode", choices=["online", "offline", "disabled"],
                   help="--weave: take the run's W&B as this instead of run.yaml's train.tracking.wandb (online: "
                        "export a run trained offline, from a node with network and `wandb login`)")
    p.add_argument("--weave-tokens", action="store_true",
                   help="--weave: each model turn's token ids too, with their decoded pieces and log-probs")


def run(args: argparse.Namespace) -> int:
    from ..view.read import ViewError, open_source
    from ..view.site import build_site

    try:
        source = open_source(args.run_dir)
    except ViewError as e:
        print(f"agentrl view: {e}", file=sys.stderr)
        return 2
    out = (args.out or source.root / "view").absolute()
    weave = None
    for flag, given in (("--weave-tokens", args.weave_tokens), ("--wandb-mode", args.wandb_mode)):
        if given and not args.weave:
            print(f"agentrl view: {flag} goes with --weave", file=sys.stderr)
            return 2
    if args.weave:
        from ..view.weave_export import WeaveRefused, import_weave, weave_project

        try:        # before anything is written: W&B offline or no weave package, nothing else is done
            weave = (weave_project(source.config, args.wandb_mode), import_weave())
        except WeaveRefused as e:
            print(f"agentrl view: {e}", file=sys.stderr)
            return 2
    only_rollouts, only_evals = args.rollout, args.eval_iter
    if only_rollouts is not None and only_evals is None:
        only_evals = []
    elif only_evals is not None and only_rollouts is None:
        only_rollouts = []
    try:
        stats = build_site(source, out, tokenizer=args.tokenizer, rollouts_only=only_rollouts,
                           evals_only=only_evals, progress=not args.quiet)
    except OSError as e:
        print(f"agentrl view: cannot write the site into {out}: {e}", file=sys.stderr)
        return 1
    print(f"agentrl view: {stats.listings} listings; {stats.written} attempt pages written, {stats.skipped} "
          f"unchanged" + (f", {stats.removed} removed" if stats.removed else ""))
    if weave is not None:
        from ..view.weave_export import log_to_weave

        if code := log_to_weave(source, out, *weave, tokens=args.weave_tokens, tokenizer=args.tokenizer,
                                rollouts_only=only_rollouts, evals_only=only_evals, progress=not args.quiet):
            return code
    print(f"open file://{out / 'index.html'}")
    if args.serve is None:
        print(f"or serve it: agentrl view {args.run_dir} --serve 8765")
        return 0
    return serve(out, args.host, args.serve)


def serve(directory: Path, host: str, port: int) -> int:
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(directory))
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as e:
        print(f"agentrl view: cannot serve on {host}:{port}: {e}", file=sys.stderr)
        return 1
    bound = server.server_address[1]
    print(f"serving {directory} at http://{host}:{bound}/ (Ctrl-C stops)")
    if host in ("127.0.0.1", "localhost", "::1"):
        print(f"from your machine: ssh -N -L {bound}:127.0.0.1:{bound} {socket.gethostname()}, "
              f"then open http://127.0.0.1:{bound}/")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
