"""`agentrl view RUN --weave`: the attempts the viewer reads, logged to Weave as call trees (docs/view.md).

Only where the run's W&B is online: run.yaml's `train.tracking` (agentrl.train.tracking.TrackingConfig,
the trainer's own W&B settings) says `wandb: online`, and its entity and project name the Weave project.
Offline or disabled, --weave refuses and nothing is logged. The weave package is the optional extra
`agentrl-hpc[weave]`, imported here only when --weave asks for it. Per attempt, one tree:

    agentrl.attempt   inputs: run, task, rollout (or eval), group, attempt, try
                      output: reward, patch, grade (reward, exit code, time, output), agent, facts
      agentrl.sample  one per sample of the attempt (a fork or a branch is a sample of its own)
        agentrl.turn  a model turn: the messages given since the last turn; its reasoning, text and tool calls
        agentrl.tool  a tool result, with the tool call it answers

Token ids go only with --weave-tokens (each turn's ids, their decoded pieces, log-probs and loss mask).
OUT/.weave.json records each attempt logged, per Weave project, with its root call's id: a re-run logs
only the attempts committed since.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from pydantic import ValidationError
from tqdm import tqdm

from hpc.fsio import write_atomic

from ..sample import Sample
from ..train.tracking import TrackingConfig
from .conversation import Block, Message, ModelTurn, conversation, turn_spans
from .model import Attempt, AttemptRef, attempt_row
from .read import Source, read_attempt
from .site import SiteWriter, read_json_object
from .tokens import Decoder

RECORD = ".weave.json"
SAVE_EVERY = 50             # attempts logged between saves of the record (a flush of weave's queue first)
INSTALL = "pip install 'agentrl-hpc[weave]'"


class WeaveRefused(Exception):
    """--weave cannot go ahead (W&B not online, no weave package); the message says why and what to do."""


class WeaveClient(Protocol):
    """What is used of weave's WeaveClient."""

    def create_call(self, op: str, inputs: dict[str, Any], parent: Any = None,
                    attributes: dict[str, Any] | None = None, display_name: str | None = None, *,
                    use_stack: bool = True) -> Any: ...

    def finish_call(self, call: Any, output: Any = None) -> None: ...

    def flush(self) -> None: ...


def weave_project(config: Mapping[str, Any], wandb_mode: str | None = None) -> str:
    """The Weave project ("entity/project", or "project": W&B's default entity) of a run whose W&B is online,
    or is taken as online (`wandb_mode`, `agentrl view --wandb-mode`: a run trained offline, exported from a
    node with network)."""
    train = config.get("train")
    tracking = train.get("tracking") if isinstance(train, dict) else None
    try:
        cfg = TrackingConfig.model_validate(tracking or {})
    except ValidationError as e:
        raise WeaveRefused(f"run.yaml's train.tracking is not valid ({e.error_count()} errors: "
                           f"{e.errors()[0]['msg']}): nothing was logged to Weave") from None
    if wandb_mode is not None:
        if wandb_mode != "online":
            raise WeaveRefused(f"--weave needs online W&B: --wandb-mode is {wandb_mode!r}; nothing was logged "
                               "to Weave and nothing else was done")
    elif cfg.wandb != "online":
        raise WeaveRefused(f"--weave needs online W&B: this run's train.tracking.wandb is {cfg.wandb!r} "
                           "(run.yaml); nothing was logged to Weave and nothing else was done. A run trained "
                           "offline is exported from a node with network with --wandb-mode online")
    return f"{cfg.entity}/{cfg.project}" if cfg.entity else cfg.project


def import_weave() -> ModuleType:
    try:
        return importlib.import_module("weave")
    except ImportError as e:
        raise WeaveRefused(f"--weave needs the weave package ({e}): {INSTALL}") from None


def connect(weave: ModuleType, project: str) -> WeaveClient:
    """weave.init: W&B's login (`wandb login`, WANDB_API_KEY) as weave finds it; no link printed per call."""
    client: WeaveClient = weave.init(project, settings={"print_call_link": False,
                                                        "implicitly_patch_integrations": False})
    return client


@dataclass
class ExportStats:
    logged: int = 0            # attempts logged now
    before: int = 0            # attempts logged by an earlier run (OUT/.weave.json)


class WeaveExporter:
    """Logs the attempts of the site writer's listings that OUT/.weave.json does not list for `project`."""

    def __init__(self, writer: SiteWriter, client: WeaveClient, project: str, *, tokens: bool = False):
        self.writer, self.client, self.project, self.tokens = writer, client, project, tokens
        self.record_path = writer.out / RECORD
        self.record = _read_record(self.record_path)
        projects = self.record["projects"]
        if not isinstance(projects.get(project), dict):
            projects[project] = {}
        self.logged: dict[str, str] = projects[project]

    def export(self, only_rollouts: list[int] | None = None, only_evals: list[int] | None = None,
               progress: bool = False) -> ExportStats:
        """Each attempt not yet logged; the record is saved after each SAVE_EVERY logged and at the end."""
        self.writer.out.mkdir(parents=True, exist_ok=True)
        stats = ExportStats()
        jobs = list(self.writer.jobs(only_rollouts, only_evals))
        total = sum(len(j.listing.refs) for j in jobs)
        try:
            with tqdm(total=total, desc="agentrl view --weave", unit="attempt",
                      disable=None if progress else True) as bar:
                for job in jobs:
                    for ref in job.listing.refs:
                        bar.update(1)
                        key = attempt_key(job.dirname, ref)
                        if key in self.logged:
                            stats.before += 1
                            continue
                        self.logged[key] = self.attempt(read_attempt(ref))
                        stats.logged += 1
                        if stats.logged % SAVE_EVERY == 0:
                            self.client.flush()
                            self._save()
            self.client.flush()
        finally:
            self._save()
        return stats

    def attempt(self, a: Attempt) -> str:
        """Log one attempt's tree; its root call's id."""
        ref, trace = a.ref, a.trace
        row = attempt_row(a)
        where = "rollout" if ref.kind == "rollout" else "eval"
        inputs = {"run": self.writer.source.name, "task": row.task, where: ref.number, "group": ref.group,
                  "attempt": ref.attempt, "try": ref.try_index, "generation": ref.generation}
        root = self.client.create_call("agentrl.attempt", inputs, attributes={"agentrl": {"kind": ref.kind}},
                                       display_name=f"{ref.title}: {row.task or 'task not recorded'}",
                                       use_stack=False)
        if getattr(root, "id", None) is None:
            raise WeaveRefused("weave logged nothing (tracing is disabled: WEAVE_DISABLED, or no client)")
        chains = trace.chains if trace is not None and len(trace.chains) == len(a.samples) else None
        for i, sample in enumerate(a.samples):
            self.sample(root, i, sample, chains[i] if chains else None)
        facts = {k: v for k, v in row.to_json().items() if k not in ("page", "problems", "task", "reward")}
        output: dict[str, Any] = {"reward": row.reward, "patch": trace.patch.text if trace else None,
                                  "grade": None, "agent": None, "facts": facts, "problems": list(a.problems)}
        if trace is not None:
            if trace.patch.omitted:
                output["patch_omitted_bytes"] = trace.patch.omitted
            if trace.grade is not None:
                g = trace.grade
                output["grade"] = {"reward": g.reward, "exit_code": g.exit_code, "duration_s": g.duration_s,
                                   "timed_out": g.timed_out, "output": g.output.text,
                                   "output_omitted_bytes": g.output.omitted}
            if trace.agent is not None:
                ag = trace.agent
                output["agent"] = {"exit_code": ag.exit_code, "timed_out": ag.timed_out,
                                   "final_text": ag.final_text, "exit_reason": ag.exit_reason}
        self.client.finish_call(root, output)
        return str(root.id)

    def sample(self, parent: Any, index: int, sample: Sample, chain: list | None) -> None:
        spans = turn_spans(sample, chain)
        first = spans[0].drift if spans else None
        start = "first" if index == 0 else "fork" if first == "fork" else "branch" if first == "root" else "sample"
        call = self.client.create_call(
            "agentrl.sample", {"sample": index, "start": start}, parent=parent,
            display_name=f"sample {index}" + (f" ({start})" if index else ""), use_stack=False)
        decoder, note = self.writer.decoder()
        blocks: list[Block]
        if decoder.decodes:
            parsers = self.writer.parsers
            blocks = conversation(sample, spans, decoder.decode, tool_parser=parsers[0], reasoning_parser=parsers[1])
        else:
            blocks = [ModelTurn(n, s.start, s.kept, s.generated, s.drift or None, s.trained, s.weight_version,
                                None, "", (), ()) for n, s in enumerate(spans, start=1)]
        pending: list[dict[str, str]] = []
        last: ModelTurn | None = None
        answered = 0
        for block in blocks:
            if isinstance(block, Message) and block.role == "tool":
                asked = last.tool_calls[answered] if last is not None and answered < len(last.tool_calls) else None
                answered += 1
                tool = self.client.create_call(
                    "agentrl.tool", {"name": asked.name if asked else None,
                                     "arguments": _arguments(asked.arguments) if asked else None},
                    parent=call, display_name=f"tool: {asked.name}" if asked else "tool result", use_stack=False)
                self.client.finish_call(tool, {"content": block.text})
            elif isinstance(block, Message):
                pending.append({"role": block.role, "content": block.text})
            else:
                turn = self.client.create_call("agentrl.turn", {"sample": index, "turn": block.number,
                                                                "messages": pending},
                                               parent=call, display_name=f"turn {block.number}", use_stack=False)
                self.client.finish_call(turn, self._turn_output(sample, block, decoder))
                pending, last, answered = [], block, 0
        self.client.finish_call(call, {
            "reward": sample.reward, "prompt_tokens": sample.prompt_length, "response_tokens": sample.response_length,
            "trained_tokens": int(sample.loss_mask.sum()), "turns": len(spans), "messages_after": pending,
            "note": None if decoder.decodes else note})

    def _turn_output(self, sample: Sample, turn: ModelTurn, decoder: Decoder) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": "assistant", "reasoning": turn.reasoning, "content": turn.content,
            "tool_calls": [{"name": c.name, "arguments": _arguments(c.arguments)} for c in turn.tool_calls],
            "drift": turn.drift, "trained": turn.trained, "weight_version": turn.weight_version,
            "kept_tokens": turn.kept, "generated_tokens": turn.generated, "problems": list(turn.problems)}
        if self.tokens:
            lo, hi = turn.start, turn.start + turn.kept
            ids = [int(t) for t in sample.tokens[sample.prompt_length + lo:sample.prompt_length + hi]]
            out["tokens"] = {"ids": ids, "pieces": [decoder.piece(t) for t in ids],
                             "logprobs": [float(x) for x in sample.rollout_log_probs[lo:hi]],
                             "loss_mask": [int(x) for x in sample.loss_mask[lo:hi]]}
        return out

    def _save(self) -> None:
        write_atomic(self.record_path, json.dumps(self.record, indent=1, sort_keys=True).encode(), fsync=False)


def attempt_key(dirname: str, ref: AttemptRef) -> str:
    """What names a committed attempt in OUT/.weave.json: its listing, generation, group, attempt and try."""
    return f"{dirname}/g{ref.generation}/{ref.group}-{ref.attempt}-{ref.try_index}"


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _read_record(path: Path) -> dict[str, Any]:
    data = read_json_object(path)
    return data if isinstance(data.get("projects"), dict) else {"version": 1, "projects": {}}


def log_to_weave(source: Source, out: Path, project: str, weave: ModuleType, *, tokens: bool,
                 tokenizer: Path | None, rollouts_only: Sequence[int] | None, evals_only: Sequence[int] | None,
                 progress: bool) -> int:
    """`agentrl view --weave` after the site is written: weave.init, then the export; 0, or 1 said on stderr."""
    try:
        client = connect(weave, project)
    except Exception as e:   # noqa: BLE001 - weave.init's login or server failures, said as they are
        print(f"agentrl view: Weave project {project} could not be opened ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    try:
        stats = export_weave(source, out, client, project, tokens=tokens, tokenizer=tokenizer,
                             rollouts_only=rollouts_only, evals_only=evals_only, progress=progress)
    except WeaveRefused as e:
        print(f"agentrl view: {e}", file=sys.stderr)
        return 1
    print(f"agentrl view: {stats.logged} attempts logged to Weave project {project}"
          + (f" ({stats.before} logged before)" if stats.before else ""))
    return 0


def export_weave(source: Source, out: Path, client: WeaveClient, project: str, *, tokens: bool = False,
                 tokenizer: Path | None = None, rollouts_only: Sequence[int] | None = None,
                 evals_only: Sequence[int] | None = None, decoder: Decoder | None = None,
                 progress: bool = False) -> ExportStats:
    """Log to `client` the attempts of `source` not yet logged to `project` (OUT/.weave.json says which);
    `decoder`, if given, instead of loading the tokenizer (tests)."""
    writer = SiteWriter(source, out, tokenizer, progress=progress, decoder=decoder)
    return WeaveExporter(writer, client, project, tokens=tokens).export(
        None if rollouts_only is None else list(rollouts_only), None if evals_only is None else list(evals_only),
        progress)
