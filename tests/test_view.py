"""agentrl view: reading a run's attempts, rendering their pages, writing the site incrementally.

The runs are written by the project's own writers (tests/view_runs.py); tokens are decoded by a
character tokenizer, so that the text on the pages can be compared with what went in. The pages in
a real browser: tests/test_view_browser.py.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from view_runs import CharTokenizer, Script, commit_attempt, make_rollout, new_run

from agentrl.cli import main
from agentrl.view.conversation import Message, ModelTurn, conversation, split_messages, token_cells, turn_spans
from agentrl.view.model import AttemptRow, figures
from agentrl.view.read import open_source, read_attempt, rollout_listing
from agentrl.view.site import MANIFEST, build_site
from agentrl.view.tokens import Decoder

TOKENIZER = CharTokenizer()
DECODER = Decoder(TOKENIZER)
HOSTILE = "<script>window.__pwned = 1</script></textarea><img src=x onerror=\"window.__pwned = 2\">"


@pytest.fixture
def run(tmp_path):
    """rollout 0: two groups of two attempts, one forked into two samples, one branched; all committed."""
    layout = new_run(tmp_path / "run")
    scripts = {(0, 0): Script("alpha"), (0, 1): Script("alpha", reward=0.0, patch="", limits=("memory",)),
               (1, 0): Script("beta", fork=True), (1, 1): Script("beta", reward=0.0, retry=True)}
    make_rollout(layout, 0, scripts, TOKENIZER.encode)
    return layout


def attempt_of(run, group: int, attempt: int):
    (ref,) = [r for r in rollout_listing(run, 0).refs if (r.group, r.attempt) == (group, attempt)]
    return read_attempt(ref)


def test_chatml_text_splits_into_messages_and_tool_responses():
    text = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nFix it.<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nok\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n")
    assert split_messages(text) == [Message("system", "Be brief."), Message("user", "Fix it."),
                                    Message("tool", "ok"), Message("tool", "2")]
    assert split_messages("no template here") == [Message("text", "no template here")]


def test_a_recorded_attempt_reads_as_its_turns_tool_call_and_result(run):
    a = attempt_of(run, 0, 0)
    assert not a.problems and len(a.samples) == 1 and a.trace is not None
    [sample] = a.samples
    blocks = conversation(sample, turn_spans(sample, a.trace.chains[0]), DECODER.decode,
                          tool_parser="qwen3_coder", reasoning_parser="qwen3")
    kinds = [b.role if isinstance(b, Message) else "model" for b in blocks]
    assert kinds == ["system", "user", "model", "tool", "model"]
    first, last = blocks[2], blocks[4]
    assert isinstance(first, ModelTurn) and isinstance(last, ModelTurn)
    assert (first.reasoning, first.content, [c.name for c in first.tool_calls]) == ("Look first.", "", ["bash"])
    assert '"command": "cat a.py"' in first.tool_calls[0].arguments
    assert (first.drift, last.drift, last.content, last.weight_version) == ("root", "clean", "Fixed it.", 3)
    assert blocks[3] == Message("tool", "def f():\n    return 1\n[exit code 0]")


def test_the_turns_found_from_the_tokens_are_those_the_trace_recorded(run):
    a = attempt_of(run, 1, 0)
    assert len(a.samples) == 2 and a.trace is not None      # the fork: a sample of its own
    for sample, chain in zip(a.samples, a.trace.chains, strict=True):
        found = turn_spans(sample, None)
        assert [(s.start, s.kept, s.weight_version) for s in found] == \
            [(s.start, s.kept, s.weight_version) for s in chain if s.trained]
    assert [s.drift for s in a.trace.chains[1]] == ["fork"]


def test_token_marks_agree_with_the_loss_mask_and_titles_hold_the_log_probs(run):
    marks = []
    for group, attempt in ((0, 0), (1, 0), (1, 1)):
        for sample in attempt_of(run, group, attempt).samples:
            prompt, response = token_cells(sample, DECODER.piece, limit=10_000)
            assert len(prompt) == sample.prompt_length and len(response) == sample.response_length
            assert [c.mark == "t" for c in response] == [bool(m) for m in sample.loss_mask]
            marks.extend(c.mark for c in response)
            for cell, mask, lp in zip(response, sample.loss_mask, sample.rollout_log_probs, strict=True):
                assert (f"logprob {lp:.4f}" in cell.title) == bool(mask)
            assert "".join(c.text for c in prompt + response) == TOKENIZER.decode(sample.tokens.tolist())
    assert set(marks) == {"t", "m", "o"}        # the branch's shared trunk: the model's, trained in the first


def test_figures_of_a_listing():
    rows = [AttemptRow("p", 0, a, 0, task=t, reward=r, empty_patch=c, drift={"clean": 2, "fork": f})
            for a, (t, r, c, f) in enumerate([("x", 1.0, "not_triggered", 0), ("x", 0.0, "no_final_text", 1),
                                              ("y", 0.0, "not_triggered", 0), ("y", 0.0, None, 0)])]
    f = figures(rows)
    assert (f.attempts, f.reward_mean, f.pass_at_1, f.k, f.pass_at_k) == (4, 0.25, 0.25, 2, 0.5)
    assert f.empty_patch_rate == pytest.approx(1 / 3) and f.drift == {"clean": 8, "fork": 1}


def test_the_site_has_an_index_a_listing_and_a_page_per_attempt(run, tmp_path):
    out = tmp_path / "site"
    stats = build_site(open_source(run.root), out, decoder=DECODER, progress=False)
    assert (stats.written, stats.skipped, stats.listings) == (4, 0, 1)
    index = (out / "index.html").read_text()
    assert 'href="rollout_0/index.html"' in index and "view-test" in index
    listing = (out / "rollout_0" / "index.html").read_text()
    assert len(re.findall(r'<tr class="att"', listing)) == 4 and 'id="filter-text"' in listing
    assert 'data-task="alpha"' in listing and 'data-class="no_final_text"' in listing
    page = (out / "rollout_0" / "0-0.html").read_text()
    assert '<div class="add">+    return 2</div>' in page and '<div class="del">-    return 1</div>' in page
    assert 'id="reward" class="good">1<' in page and "tool call: <b>bash</b>" in page
    assert page.count('class="tk t" title=') == int(attempt_of(run, 0, 0).samples[0].loss_mask.sum())
    forked = (out / "rollout_0" / "1-0.html").read_text()
    assert "Sample 2 of 2" in forked and "fork: this sample" in forked
    branched = (out / "rollout_0" / "1-1.html").read_text()
    assert "a branch: this chain shares its first turns" in branched and "trained in an earlier sample" in branched
    limited = (out / "rollout_0" / "0-1.html").read_text()
    assert "Empty: the agent changed nothing." in limited and '<span class="bad">limit: memory</span>' in limited
    assert listing.count("limit: memory") == 1 and "limit: memory" not in page
    # nothing from the network: every link and script is a relative file of the site
    for html in (index, listing, page):
        assert not re.search(r'(src|href)="(https?:)?//', html)
    assert (out / "view.css").is_file() and (out / "view.js").is_file()


def test_a_re_run_rewrites_only_what_changed_and_adds_new_attempts(tmp_path):
    run = new_run(tmp_path / "run")
    scripts = {(0, 0): Script("alpha"), (0, 1): Script("alpha", reward=0.0)}
    ledger, pending = make_rollout(run, 0, scripts, TOKENIZER.encode, commit={(0, 0)})
    out = tmp_path / "site"
    source = open_source(run.root)
    assert build_site(source, out, decoder=DECODER, progress=False).written == 1
    listing = (out / "rollout_0" / "index.html").read_text()
    assert "1 of 1 attempts" in listing and "open: 1 attempts committed so far" in listing
    page = out / "rollout_0" / "0-0.html"
    before = page.stat().st_mtime_ns
    again = build_site(source, out, decoder=DECODER, progress=False)
    assert (again.written, again.skipped) == (0, 1) and page.stat().st_mtime_ns == before

    commit_attempt(run, ledger, pending[(0, 1)], scripts[(0, 1)], TOKENIZER.encode)     # lands meanwhile
    ledger.close_rollout(0)
    stats = build_site(source, out, decoder=DECODER, progress=False)
    assert (stats.written, stats.skipped) == (1, 1) and (out / "rollout_0" / "0-1.html").exists()
    listing = (out / "rollout_0" / "index.html").read_text()
    assert "2 of 2 attempts" in listing and "<p>closed</p>" in listing

    trace = next(run.trajectories_dir.rglob("0-0-0.json"))
    os.utime(trace, ns=(before + 10**9, before + 10**9))       # a changed input: its page is rewritten
    assert build_site(source, out, decoder=DECODER, progress=False).written == 1
    (out / "rollout_0" / MANIFEST).write_text("not json")       # a damaged manifest: every page again
    assert build_site(source, out, decoder=DECODER, progress=False).written == 2


def test_an_agents_hostile_text_is_shown_as_text(tmp_path):
    run = new_run(tmp_path / "run")
    script = Script(HOSTILE, command=HOSTILE, tool_output=HOSTILE, final=HOSTILE, grade_output=HOSTILE,
                    patch=f"diff --git a/x b/x\n+{HOSTILE}\n")
    make_rollout(run, 0, {(0, 0): script}, TOKENIZER.encode, attempts=1)
    out = tmp_path / "site"
    build_site(open_source(run.root), out, decoder=DECODER, progress=False)
    for page in (out / "rollout_0" / "0-0.html", out / "rollout_0" / "index.html"):
        html = page.read_text()
        assert "<script>window" not in html and "<img" not in html and "</textarea>" not in html
        assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;&lt;/textarea&gt;" in html
        assert len(re.findall(r"<script\b", html)) == (1 if page.name == "index.html" else 0)


def test_a_trace_that_is_missing_or_damaged_is_said_on_the_page(run, tmp_path):
    traces = sorted(run.trajectories_dir.rglob("*.json"))
    traces[0].unlink()
    traces[1].write_text("{")
    out = tmp_path / "site"
    build_site(open_source(run.root), out, decoder=DECODER, progress=False)
    pages = sorted((out / "rollout_0").glob("*-*.html"))
    texts = [p.read_text() for p in pages]
    assert sum("no trace (" in t for t in texts) == 1 and sum("its trace could not be read" in t for t in texts) == 1
    assert all("Sample 1 of" in t for t in texts)       # the samples are shown all the same


def test_without_a_tokenizer_the_tokens_are_ids(run, tmp_path):
    out = tmp_path / "site"
    build_site(open_source(run.root), out, progress=False)      # run.yaml names no model
    assert "no tokenizer" in (out / "index.html").read_text()
    sample = attempt_of(run, 0, 0).samples[0]
    page = (out / "rollout_0" / "0-0.html").read_text()
    assert f'title="#0 id {int(sample.tokens[0])}">{int(sample.tokens[0])} </span>' in page


def test_the_command_refuses_a_directory_that_is_no_run(tmp_path, capsys):
    assert main(["view", str(tmp_path)]) == 2
    assert "neither a run directory" in capsys.readouterr().err


def test_the_command_writes_into_the_run_and_says_how_to_open_it(run, capsys):
    assert main(["view", str(run.root), "--quiet", "--rollout", "0"]) == 0
    out = capsys.readouterr().out
    assert f"file://{run.root / 'view' / 'index.html'}" in out and "--serve" in out
    assert np.all([(run.root / "view" / "rollout_0" / f"{g}-{a}.html").exists() for g in (0, 1) for a in (0, 1)])
