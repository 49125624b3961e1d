"""Writing the site, incrementally: only the pages whose inputs changed since the last time.

    OUT/index.html  view.css  view.js
    OUT/rollout_<r>/index.html  <group>-<attempt>.html  .manifest.json
    OUT/eval_<n>/index.html     <group>-<attempt>.html  .manifest.json

Each listing's directory keeps a manifest: per attempt page, its inputs' (path, mtime, size) and
its row, so that a re-run reads only the attempts that changed or are new, and rewrites a listing
from the rows it kept. Pages are written whole (hpc.fsio.write_atomic): a reader of a running
site never sees half of one. The index is rewritten every time; it is small.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from hpc.fsio import write_atomic

from .assets import CSS, JS
from .model import AttemptRef, AttemptRow, Figures, attempt_row, figures
from .pages import ListingLink, render_attempt, render_index, render_listing, templates_digest
from .read import (
    Listing,
    Source,
    eval_listing,
    parsers,
    read_attempt,
    rollout_listing,
    rollouts,
    signature,
    tokenizer_path,
)
from .tokens import NO_TOKENIZER, Decoder, load_decoder

MANIFEST = ".manifest.json"
RENDER_VERSION = 1          # a new version rewrites every page (as do changed templates)


@dataclass
class BuildStats:
    written: int = 0          # attempt pages (re)written
    skipped: int = 0          # attempt pages whose inputs had not changed
    removed: int = 0          # pages of attempts no longer committed (a reopened rollout)
    listings: int = 0


@dataclass
class _Job:
    """One listing to bring up to date."""

    dirname: str              # rollout_<r> or eval_<n>
    title: str
    listing: Listing
    state: str
    kind_index: tuple[int, int] = (0, 0)     # rollouts first, by number
    rows: list[AttemptRow] = field(default_factory=list)


class SiteWriter:
    def __init__(self, source: Source, out: Path, tokenizer: Path | None = None, progress: bool = True,
                 decoder: Decoder | None = None):
        self.source, self.out, self.progress = source, Path(out), progress
        self.tokenizer = tokenizer if tokenizer is not None else tokenizer_path(source)
        self.parsers = parsers(source)
        self._decoder: tuple[Decoder, str | None] | None = None if decoder is None else (decoder, None)
        self.key = f"{RENDER_VERSION}:{templates_digest()}:{self.tokenizer or ''}"

    def decoder(self) -> tuple[Decoder, str | None]:
        """Loaded once, and only when a page has tokens to show."""
        if self._decoder is None:
            self._decoder = load_decoder(self.tokenizer)
        return self._decoder

    def jobs(self, only_rollouts: list[int] | None, only_evals: list[int] | None) -> Iterator[_Job]:
        if self.source.run is not None:
            for r in rollouts(self.source):
                if only_rollouts is None or r in only_rollouts:
                    listing = rollout_listing(self.source.run, r)
                    state = "closed" if listing.closed else f"open: {len(listing.refs)} attempts committed so far"
                    yield _Job(f"rollout_{r}", f"rollout {r}", listing, state, (0, r))
        for n, eval_dir in self.source.evals:
            if only_evals is None or n in only_evals:
                listing = eval_listing(n, eval_dir)
                state = "scored" if listing.closed else f"being scored: {len(listing.refs)} attempts so far"
                yield _Job(f"eval_{n}", f"eval iter_{n}", listing, state, (1, n))

    def build(self, only_rollouts: list[int] | None = None, only_evals: list[int] | None = None) -> BuildStats:
        self.out.mkdir(parents=True, exist_ok=True)
        for name, text in (("view.css", CSS), ("view.js", JS)):
            _write_if_changed(self.out / name, text.encode())
        stats = BuildStats()
        jobs = list(self.jobs(only_rollouts, only_evals))
        total = sum(len(j.listing.refs) for j in jobs)
        with tqdm(total=total, desc="agentrl view", unit="attempt", disable=None if self.progress else True) as bar:
            for job in jobs:
                self._listing(job, stats, bar)
                stats.listings += 1
        self._index()
        return stats

    def _listing(self, job: _Job, stats: BuildStats, bar: tqdm) -> None:
        directory = self.out / job.dirname
        directory.mkdir(exist_ok=True)
        manifest = read_json_object(directory / MANIFEST)
        known: dict[str, Any] = manifest.get("pages", {}) if manifest.get("key") == self.key else {}
        pages: dict[str, Any] = {}
        for ref in job.listing.refs:
            inputs = [list(s) for s in signature(ref.inputs())]
            entry = known.get(ref.page)
            if entry is not None and entry.get("inputs") == inputs and (directory / ref.page).exists():
                row = AttemptRow.from_json(entry["row"])
                stats.skipped += 1
            else:
                row = self._attempt(ref, job.title, directory)
                stats.written += 1
            pages[ref.page] = {"inputs": inputs, "row": row.to_json()}
            job.rows.append(row)
            bar.update(1)
        for page in set(known) - set(pages):
            (directory / page).unlink(missing_ok=True)
            stats.removed += 1
        figs = figures(job.rows)
        listing_key = _digest([self.key, job.state, job.listing.problems, [r.to_json() for r in job.rows]])
        if listing_key != manifest.get("listing_key") or not (directory / "index.html").exists():
            html = render_listing(self.source.name, job.title, job.state, figs, job.rows, job.listing.problems)
            write_atomic(directory / "index.html", html.encode(), fsync=False)
        write_atomic(directory / MANIFEST, json.dumps({
            "key": self.key, "title": job.title, "state": job.state, "order": list(job.kind_index),
            "figures": figs.to_json(), "listing_key": listing_key, "pages": pages}).encode(), fsync=False)

    def _attempt(self, ref: AttemptRef, listing_title: str, directory: Path) -> AttemptRow:
        attempt = read_attempt(ref)
        row = attempt_row(attempt)
        decoder, note = self.decoder() if attempt.samples else (Decoder(), None)
        html = render_attempt(self.source.name, listing_title, attempt, row, decoder, note, self.parsers)
        write_atomic(directory / ref.page, html.encode(), fsync=False)
        return row

    def _index(self) -> None:
        """The index, from every listing's manifest (those not rebuilt this time too)."""
        links: list[tuple[list[int], ListingLink]] = []
        for manifest_path in sorted(self.out.glob(f"*/{MANIFEST}")):
            m = read_json_object(manifest_path)
            if "figures" not in m or "order" not in m:
                continue
            links.append((m["order"], ListingLink(m.get("title", manifest_path.parent.name),
                                                  f"{manifest_path.parent.name}/index.html", m.get("state", ""),
                                                  Figures(**m["figures"]))))
        links.sort(key=lambda x: x[0])
        note = f"{NO_TOKENIZER}: tokens are ids" if self.tokenizer is None else None
        html = render_index(self.source.name, str(self.source.root), [lk for o, lk in links if o[0] == 0],
                            [lk for o, lk in links if o[0] == 1], [], note)
        write_atomic(self.out / "index.html", html.encode(), fsync=False)


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object the viewer keeps (a listing's manifest, the Weave record); {} when there is none or it cannot
    be read (every page is then rewritten, every attempt logged again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _write_if_changed(path: Path, data: bytes) -> None:
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    write_atomic(path, data, fsync=False)


def build_site(source: Source, out: Path, *, tokenizer: Path | None = None, rollouts_only: list[int] | None = None,
               evals_only: list[int] | None = None, progress: bool = True,
               decoder: Decoder | None = None) -> BuildStats:
    """Bring the site in `out` up to date; `decoder`, if given, instead of loading the tokenizer (tests)."""
    return SiteWriter(source, out, tokenizer, progress, decoder).build(rollouts_only, evals_only)
