"""Reading what a run (or one eval) holds into the viewer's data (model.py). Every read is here.

A rollout's attempts are those its ledger committed in its current generation, each with its shard
(hpc.buffer) and its trace (agentrl.pool.trace); an eval's are those its own ledger committed, each
with its result (eval/iter_<n>/attempts/), its trace and, with eval.save_samples, its shard. A file
that cannot be read becomes a problem the page states, never an exception: a viewer of a running or
damaged run shows what it can.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc.buffer import read_shard
from hpc.ledger_view import LedgerError, LedgerView
from hpc.records import RecordError, read_record
from hpc.runlayout import EvalLayout, RunDirError, RunLayout

from ..pool.trace import AttemptTrace
from ..report.data import MetricLog, parse_metrics
from ..sample import SAMPLE_CODEC
from .model import Attempt, AttemptRef

_ITER = re.compile(r"^iter_(0|[1-9][0-9]*)$")
Signature = list[tuple[str, int, int]]      # (path, mtime_ns, size) of each input that exists


class ViewError(Exception):
    """The directory cannot be viewed; the message names it and says what to give instead."""


@dataclass(frozen=True)
class Source:
    """What `agentrl view` was pointed at: a run directory, or one eval directory."""

    root: Path
    name: str                             # the run's id, or the eval directory's name
    run: RunLayout | None                 # None: a lone eval directory
    evals: list[tuple[int, Path]]         # (iteration, directory)
    config: dict[str, Any] = field(default_factory=dict)    # run.yaml's (the enclosing run's, for an eval)


def open_source(path: Path | str) -> Source:
    root = Path(path).absolute()
    if RunLayout.holds_run(root):
        try:
            run = RunLayout.open(root)
            manifest = run.manifest()
        except (RunDirError, RecordError) as e:
            raise ViewError(str(e)) from None
        return Source(root, manifest.run_id, run, eval_dirs(run.evals_dir), manifest.config)
    m = _ITER.match(root.name)
    if m and root.is_dir() and (EvalLayout(root).ledger_dir.is_dir() or EvalLayout(root).summary_path.exists()):
        return Source(root, root.name, None, [(int(m.group(1)), root)], _config_of(root.parent.parent))
    raise ViewError(f"{root} is neither a run directory (no run.yaml) nor an eval directory (iter_<n> with a "
                    "ledger/ or summary.json): give RUN or RUN/eval/iter_<n>")


def _config_of(run_dir: Path) -> dict[str, Any]:
    """The config of the run an eval directory lies in (for its tokenizer and parsers); {} if none."""
    try:
        return RunLayout.open(run_dir).manifest().config if RunLayout.holds_run(run_dir) else {}
    except (RunDirError, RecordError):
        return {}


def eval_dirs(eval_root: Path) -> list[tuple[int, Path]]:
    if not eval_root.is_dir():
        return []
    return sorted((int(m.group(1)), d) for d in eval_root.iterdir() if (m := _ITER.match(d.name)) and d.is_dir())


def tokenizer_path(source: Source) -> Path | None:
    """The trained model's directory (run.yaml's train.model, made absolute at launch), if it is there."""
    train = source.config.get("train")
    model = train.get("model") if isinstance(train, dict) else None
    return Path(model) if isinstance(model, str) and Path(model).is_dir() else None


def parsers(source: Source) -> tuple[str | None, str | None]:
    """(tool_parser, reasoning_parser) of the run's pool section, read as the pool reads it (a run made before
    the adapter's keys moved included); the adapter's defaults where the section is unset or unreadable."""
    from ..adapter.settings import AdapterSettings
    from ..pool.config import PoolConfigError, load_pool_config

    try:
        adapter = load_pool_config(source.config.get("pool")).adapter
    except PoolConfigError:
        adapter = AdapterSettings()
    return adapter.tool_parser, adapter.reasoning_parser


# ---------------------------------------------------------------- listings


@dataclass(frozen=True)
class Listing:
    """A rollout's or an eval's committed attempts, now."""

    refs: list[AttemptRef]
    closed: bool                  # a rollout closed, an eval summarized
    problems: list[str] = field(default_factory=list)


def rollouts(source: Source) -> list[int]:
    if source.run is None or not (source.run.ledger_dir / "rollouts").is_dir():
        return []
    return LedgerView(source.run.ledger_dir).rollouts()


def rollout_listing(run: RunLayout, rollout_id: int) -> Listing:
    ledger = LedgerView(run.ledger_dir)
    try:
        generation = ledger.current_generation(rollout_id)
        if generation is None:
            return Listing([], False, [f"rollout {rollout_id} was never opened"])
        commits = ledger.commits(rollout_id)
        closed = ledger.closed(rollout_id) is not None
    except (LedgerError, RecordError, OSError) as e:
        return Listing([], False, [f"the ledger of rollout {rollout_id} could not be read: {e}"])
    traces = run.trajectories_dir / f"rollout_{rollout_id}" / f"g{generation}"
    refs = [AttemptRef("rollout", rollout_id, generation, g, a, c.try_index, run.buffer_dir / c.ref,
                       traces / f"{g}-{a}-{c.try_index}.json") for (g, a), c in sorted(commits.items())]
    return Listing(refs, closed)


def eval_listing(iteration: int, eval_dir: Path) -> Listing:
    layout = EvalLayout(eval_dir)
    if not layout.ledger_dir.is_dir():
        return Listing([], False, [f"{eval_dir} has no ledger/: nothing of it was scored here"])
    ledger = LedgerView(layout.ledger_dir)
    try:
        generation = ledger.current_generation(0)
        commits = ledger.commits(0) if generation is not None else {}
    except (LedgerError, RecordError, OSError) as e:
        return Listing([], False, [f"the ledger of {eval_dir} could not be read: {e}"])
    refs = []
    for (g, a), c in sorted(commits.items()):
        name = f"{g}-{a}-{c.try_index}"
        shard = layout.samples_dir / "rollout_0" / f"g{generation}" / f"{name}.msgpack"
        refs.append(AttemptRef("eval", iteration, generation or 0, g, a, c.try_index,
                               shard if shard.exists() else None, layout.trajectories_dir / f"{name}.json",
                               eval_dir / c.ref))
    return Listing(refs, layout.summary_path.exists())


def metric_log(source: Source) -> MetricLog | None:
    path = source.run.metrics_path if source.run else None
    try:
        return parse_metrics(path.read_text()) if path else None
    except (FileNotFoundError, OSError):
        return None


# ---------------------------------------------------------------- one attempt


def signature(paths: list[Path]) -> Signature:
    """What says whether a page's inputs changed: each existing input's path, mtime and size."""
    out = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((str(p), st.st_mtime_ns, st.st_size))
    return out


def read_attempt(ref: AttemptRef) -> Attempt:
    out = Attempt(ref)
    if ref.shard is not None:
        try:
            _header, out.samples = read_shard(ref.shard, SAMPLE_CODEC)
        except RecordError as e:
            out.problems.append(f"its samples could not be read: {e}")
    if ref.trace is not None:
        if ref.trace.exists():
            try:
                out.trace = read_record(ref.trace, AttemptTrace)
            except RecordError as e:
                out.problems.append(f"its trace could not be read: {e}")
        else:
            out.problems.append(f"no trace ({ref.trace.name}): the patch and the grader's output were not "
                                "recorded (an agentrl before traces, or the write failed: the pool's log says)")
    if ref.result is not None:
        try:
            result = json.loads(ref.result.read_text())
            out.result = result if isinstance(result, dict) else None
        except (OSError, ValueError) as e:
            out.problems.append(f"its result {ref.result} could not be read: {e}")
    if ref.kind == "eval" and ref.shard is None:
        out.problems.append("its samples were not kept (eval.save_samples: true keeps them): no conversation "
                            "or tokens to show")
    return out
