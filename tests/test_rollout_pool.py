"""The pool worker for real: ledger claims, bwrap sandboxes, the builtin agent, the adapter, grading, shards.

The model's token choices come from a scripted /generate registered as the run's inference server: it
fixes the bundled task with one bash call, then answers.
"""

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from scripted_upstream import ScriptedUpstream, logprob

from agentrl.pool.config import load_pool_config
from agentrl.pool.trace import AttemptTrace, trace_path
from agentrl.pool.worker import SPANS, PoolWorker
from agentrl.prompts.groups import open_rollout
from agentrl.prompts.source import PromptSource, load_prompt_rows
from agentrl.sample import SAMPLE_CODEC
from agentrl.swe.harbor import BUNDLED_TASKS
from agentrl.train.config import load_train_config
from hpc.buffer import read_rollout
from hpc.ledger import Claim, Ledger
from hpc.records import read_record
from hpc.registry import Registry
from hpc.runlayout import RunLayout

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (make sysdeps)")]

FIX = ("python3 -c \"import pathlib; p = pathlib.Path('roman/convert.py'); "
       "p.write_text(p.read_text().replace('(10, \\\"X\\\"), (5, \\\"V\\\"), (1, \\\"I\\\"),', "
       "'(10, \\\"X\\\"), (9, \\\"IX\\\"), (5, \\\"V\\\"), (4, \\\"IV\\\"), (1, \\\"I\\\"),'))\"")
CALL = {"role": "assistant", "content": "", "reasoning_content": "Patch the table.",
        "tool_calls": [{"id": "x", "type": "function", "function": {"name": "bash", "arguments": {"command": FIX}}}]}
DONE = {"role": "assistant", "content": "Fixed the subtractive pairs.", "reasoning_content": "Tests should pass."}


@pytest.fixture
def scratch():
    """The pool's scratch directory, short: the adapter's socket path in it must fit a socket's address
    (107 bytes), which pytest-xdist's deeper tmp_path does not leave room for."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="pool-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def run(tiny_model, tmp_path, scratch):
    prompts = tmp_path / "prompts.jsonl"
    subprocess.run([sys.executable, "-m", "agentrl.cli", "convert", "harbor", str(BUNDLED_TASKS / "roman-subtractive"),
                    "--out", str(prompts)], check=True, capture_output=True, cwd=ROOT)
    return RunLayout.create(tmp_path / "run", config={
        "train": {"model": str(tiny_model), "prompt_data": str(prompts), "num_rollouts": 1, "rollout_batch_size": 1,
                  "n_samples_per_prompt": 2},
        "pool": {"harness": "builtin", "max_agents": 2, "max_booting": 2, "lease_s": 30, "poll_s": 0.1,
                 "tools_dir": str(tmp_path / "tools"), "scratch_dir": str(scratch)}})


def step(upstream):
    def choose(request):
        text = upstream.tokenizer.decode(request["input_ids"])
        return DONE if "<tool_response>" in text else CALL
    return choose


def test_a_pool_worker_runs_attempts_end_to_end(run, tiny_model):
    config = run.manifest().config
    train, pool = load_train_config(config["train"]), load_pool_config(config["pool"])
    with ScriptedUpstream(tiny_model) as upstream:
        upstream.push(*[step(upstream)] * 4)
        Registry(run.services_dir).register("inference", 0, host="127.0.0.1", port=int(upstream.url.rsplit(":", 1)[1]))
        ledger = Ledger(run.ledger_dir)
        source = PromptSource(load_prompt_rows(train.prompt_data), rollout_batch_size=1)
        open_rollout(ledger, source, 0, attempts=2, temperature=train.rollout_temperature)
        spans: list[tuple[Claim, str, float, float]] = []

        async def go():
            stop = asyncio.Event()
            worker = PoolWorker(run, pool, train.model, train.prompt_data,
                                on_span=lambda *span: spans.append(span))     # list.append: thread-safe
            serving = asyncio.create_task(worker.serve(stop))
            for _ in range(600):
                if ledger.status(0).committed == 2 or serving.done():
                    break
                await asyncio.sleep(0.1)
            stop.set()
            return await serving
        counts = asyncio.run(go())
    assert counts["committed"] == 2 and not counts["infra_failures"] and not counts["errors"], counts
    groups = read_rollout(ledger, run.buffer_dir, 0, SAMPLE_CODEC)
    samples = groups[0]
    assert sorted(s.attempt for s in samples) == [0, 1]
    sampled = [upstream.output_ids(CALL), upstream.output_ids(DONE)]
    for s in samples:
        assert s.reward == 1.0 and s.metadata.harness == "builtin" and s.metadata.exit_code == 0
        assert s.metadata.empty_patch == "not_triggered" and s.metadata.patch_bytes > 0
        response = s.tokens[len(s.tokens) - s.response_length:]
        trained = [(int(t), float(lp)) for t, m, lp in zip(response, s.loss_mask, s.rollout_log_probs, strict=True)
                   if m]
        assert trained == [(t, pytest.approx(logprob(i, t))) for ids in sampled for i, t in enumerate(ids)]
    assert not Registry(run.services_dir).services("pool")          # deregistered at the end
    # Each committed attempt's trace (agentrl view reads it): the patch, the grade, the turns of its sample
    for (g, a), commit in ledger.commits(0).items():
        claim = Claim(0, g, a, ledger.current_generation(0), commit.try_index)
        trace = read_record(trace_path(run.trajectories_dir, claim), AttemptTrace)
        assert trace.task == "roman-subtractive" and "roman/convert.py" in trace.patch.text
        assert trace.grade is not None and trace.grade.reward == 1.0 and trace.agent is not None
        assert trace.agent.exit_code == 0 and trace.agent.final_text == DONE["content"]
        assert [[(t.drift, t.trained) for t in chain] for chain in trace.chains] == [[("root", True), ("clean", True)]]

    # Every attempt's spans, each once, in the order the worker goes through them
    by_attempt: dict[int, dict[str, tuple[float, float]]] = {}
    for claim, name, start, end in spans:
        assert start <= end and name not in by_attempt.setdefault(claim.attempt, {}), (claim, name)
        by_attempt[claim.attempt][name] = (start, end)
    assert sorted(by_attempt) == [0, 1]
    for s in samples:
        got = by_attempt[s.attempt]
        assert set(got) == set(SPANS), got
        assert got["claim"][1] <= got["attempt"][0] <= got["boot"][0] == got["boot_queue"][0]
        assert got["boot_queue"][1] <= got["boot"][1] <= got["agent"][0] == got["agent_queue"][0]
        assert got["agent_queue"][1] <= got["agent"][1] <= got["grade"][0] == got["grade_queue"][0]
        assert got["grade_queue"][1] <= got["grade"][1] <= got["teardown"][0] <= got["teardown"][1]
        assert got["teardown"][1] <= got["attempt"][1] <= got["shard"][0] <= got["shard"][1] <= got["commit"][0]
        for phase in ("boot", "agent", "grade"):       # the metadata's timings are these spans' lengths
            assert s.metadata.timings()[f"{phase}_s"] == round(got[phase][1] - got[phase][0], 3)


def test_an_attempt_waits_out_a_dead_model_server_under_its_lease_and_spends_no_try(run, tiny_model):
    """The registry names a server that is gone (killed; its heartbeat not yet stale): the claimed
    attempt waits, its lease renewed, boots no sandbox and starts no agent against it (a CLI with a
    short retry budget would give up and spend the try); once a server answers /health (the restarted
    one, here at another address) it runs, and commits on its first try."""
    import socket
    import time

    config = run.manifest().config
    train, pool = load_train_config(config["train"]), load_pool_config(config["pool"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]      # closed: nothing answers there
    registry = Registry(run.services_dir)
    registry.register("inference", 0, host="127.0.0.1", port=dead_port)
    spans: list[tuple[Claim, str, float, float]] = []
    with ScriptedUpstream(tiny_model) as upstream:
        upstream.push(*[step(upstream)] * 2)
        ledger = Ledger(run.ledger_dir)
        source = PromptSource(load_prompt_rows(train.prompt_data), rollout_batch_size=1)
        open_rollout(ledger, source, 0, attempts=1, temperature=train.rollout_temperature)

        async def go():
            stop = asyncio.Event()
            worker = PoolWorker(run, pool, train.model, train.prompt_data, on_span=lambda *span: spans.append(span))
            serving = asyncio.create_task(worker.serve(stop))
            for _ in range(300):        # claimed, and held while nothing answers
                if ledger.status(0).claimed == 1:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(3)
            held = ledger.status(0)
            up = time.monotonic()
            registry.register("inference", 0, host="127.0.0.1", port=int(upstream.url.rsplit(":", 1)[1]))
            for _ in range(600):
                if ledger.status(0).committed == 1 or serving.done():
                    break
                await asyncio.sleep(0.1)
            stop.set()
            return held, up, await serving
        held, up, counts = asyncio.run(go())
    assert (held.claimed, held.committed, held.failed) == (1, 0, 0), held
    assert counts["committed"] == 1 and not counts["infra_failures"] and not counts["errors"], counts
    (commit,) = ledger.commits(0).values()
    assert commit.try_index == 0
    started = {name: start for _, name, start, _ in spans}
    assert started["claim"] < up < started["boot"], started   # nothing booted before a server was up


def test_an_agent_answered_after_a_server_error_owns_its_exit_and_is_graded_on_its_first_try(run, tiny_model):
    """The model server fails one call (as it does while killed, or SGLang aborting for a weight
    update); the agent retries, is answered, and exits 2 because that answer was cut at the token
    limit: the agent's own outcome, graded and trained at reward 0 on try 0, not an infrastructure
    failure that spends a try (three such in a row failed an attempt for good, and its rollout with it)."""
    config = run.manifest().config
    train = load_train_config(config["train"])
    pool = load_pool_config({**config["pool"], "adapter": {"max_new_tokens": 64}})
    rambling = {"role": "assistant", "content": "The table " * 100}     # cut at max_new_tokens
    with ScriptedUpstream(tiny_model) as upstream:
        upstream.push({"fail": 503}, rambling, rambling)
        Registry(run.services_dir).register("inference", 0, host="127.0.0.1", port=int(upstream.url.rsplit(":", 1)[1]))
        ledger = Ledger(run.ledger_dir)
        source = PromptSource(load_prompt_rows(train.prompt_data), rollout_batch_size=1)
        open_rollout(ledger, source, 0, attempts=1, temperature=train.rollout_temperature)

        async def go():
            stop = asyncio.Event()
            serving = asyncio.create_task(PoolWorker(run, pool, train.model, train.prompt_data).serve(stop))
            for _ in range(600):
                if ledger.status(0).committed == 1 or serving.done():
                    break
                await asyncio.sleep(0.1)
            stop.set()
            return await serving
        counts = asyncio.run(go())
    assert counts["committed"] == 1 and not counts["infra_failures"], counts
    (commit,) = ledger.commits(0).values()
    assert commit.try_index == 0
    (sample,) = read_rollout(ledger, run.buffer_dir, 0, SAMPLE_CODEC)[0]
    assert sample.reward == 0.0 and sample.metadata.exit_code == 2


def test_a_record_that_is_not_a_task_fails_its_claim_and_not_the_worker():
    import asyncio
    from collections import Counter
    from types import SimpleNamespace

    from agentrl.pool.worker import PoolWorker
    from agentrl.swe.loaded import load_record
    from hpc.ledger import Claim

    failed = []

    bad = {"prompt": "p", "metadata": {"instance_id": "t", "image": "host", "workdir": "/", "eval_command": "true",
                                       "timeouts": {"agent_s": 1, "eval_s": 1},
                                       "harbor": {"test_sh": "", "test_files": {"../../etc/x": ""}}}}
    worker = SimpleNamespace(task_for=lambda claim: load_record(bad), counts=Counter(),
                             ledger=SimpleNamespace(fail=lambda claim, reason: failed.append((claim, reason))))
    claim = Claim(rollout_id=0, group=3, attempt=1, generation=0)
    asyncio.run(PoolWorker._attempt(worker, None, claim))
    assert worker.counts["bad_tasks"] == 1
    (got, reason), = failed
    assert got == claim and reason.startswith("task: ") and "workdir" in reason


def test_a_shard_the_filesystem_refuses_fails_the_claim_named_and_not_the_worker(monkeypatch, tmp_path):
    """An OSError from writing the shard (a full or read-only shared filesystem) is logged and counted, and
    the claim fails with it, so another try can land; nothing is committed."""
    from collections import Counter
    from types import SimpleNamespace

    import numpy as np

    from agentrl.pool import claimed
    from agentrl.pool.attempt import AttemptOutcome
    from agentrl.sample import AttemptMetadata, Sample

    sample = Sample(tokens=np.arange(6), response_length=3, loss_mask=np.ones(3), rollout_log_probs=np.zeros(3),
                    reward=1.0, status="completed", group_index=3, attempt=1)

    async def attempt_that_finished(*args, **kwargs):
        return AttemptOutcome(samples=[sample], reward=1.0, metadata=AttemptMetadata())
    monkeypatch.setattr(claimed, "run_attempt", attempt_that_finished)
    (tmp_path / "buffer").write_text("a file where the buffer directory should be")
    failed, committed = [], []
    ledger = SimpleNamespace(commit=lambda claim, ref: committed.append(ref) or True,
                             fail=lambda claim, reason: failed.append((claim, reason)))
    records = claimed.AttemptRecords(tmp_path / "traces", per_rollout=True, shards=tmp_path / "buffer")

    async def up(**kwargs):
        return "http://model-server"
    ctx = SimpleNamespace(adapter=SimpleNamespace(pool=SimpleNamespace(wait_healthy=up)))
    claim = Claim(rollout_id=0, group=3, attempt=1, generation=0)
    counts = Counter()

    def attempt():
        return asyncio.run(claimed.run_claimed(ctx, ledger, claim, None, {}, records, counts, where="here"))
    assert attempt() is None
    assert counts["io_errors"] == 1 and not counts["committed"] and committed == []
    (got, reason), = failed
    assert got == claim and reason.startswith("io: ") and "buffer" in reason

    # A trace the filesystem refuses is only logged: training never reads it, so the attempt commits
    assert len(list((tmp_path / "traces").rglob("3-1-0.json"))) == 1      # written before the shard failed
    (tmp_path / "buffer").unlink()
    shutil.rmtree(tmp_path / "traces")
    (tmp_path / "traces").write_text("a file where the traces should go")
    failed.clear()
    assert attempt() is not None
    assert committed == ["rollout_0/g0/3-1-0.msgpack"] and not failed and counts["io_errors"] == 1
    assert counts["committed"] == 1 and (tmp_path / "buffer" / committed[0]).exists()

    # Another try's commit: this try's shard is never read, and goes
    ledger.commit = lambda claim, ref: False
    attempt()
    assert counts["stale"] == 1 and not (tmp_path / "buffer" / committed[0]).exists()


def test_the_pool_samples_at_the_temperature_the_trainer_computes_log_probs_at(run, tmp_path):
    """pool.temperature may only repeat train.rollout_temperature: sampling at another makes every PPO
    ratio wrong. A run whose sections disagree is refused before the pool claims anything."""
    pool = load_pool_config({"temperature": 0.7})
    with pytest.raises(ValueError, match="pool.temperature 0.7 differs from train.rollout_temperature 1.0"):
        pool.sampling(1.0)
    assert pool.sampling(0.7)["temperature"] == 0.7
    assert load_pool_config({}).sampling(0.5) == {"temperature": 0.5, "top_p": 1.0, "max_new_tokens": 4096}
    config = run.manifest().config
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({**config, "pool": {**config["pool"], "temperature": 0.7}}))
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "pool", str(run.root), "--config", str(bad)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "differs from train.rollout_temperature" in r.stderr, r.stderr


# What a policy under training may do to its own sandbox, one cause per attempt (the task's limits below)
BREAKS = {
    "storage": "python3 -c \"import os\nf = open('big', 'wb')\nwhile True: f.write(os.urandom(1 << 20))\"",
    "memory": "python3 -c \"b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096])\"",
    "pids": "python3 -c \"import subprocess\nfor _ in range(200): subprocess.Popen(['sleep', '60'])\"",
    "time": "sleep 60",
}


def test_what_the_agent_breaks_is_its_outcome_trained_at_reward_0_and_never_retried(run, tiny_model, tmp_path):
    """Each limit the agent runs into ends its attempt as its own outcome: committed on the first try, its
    samples trained at reward 0, the limit named in their metadata and the trace. The disk filled to the
    last byte even breaks taking the patch (the grader's baseline lives on that disk), which used to be
    an infrastructure failure, retried until its bound."""
    from hpc.images.hostroot import build_host_rootfs
    build_host_rootfs(tmp_path / "rootfs")          # an image: its own layer is on the sandbox's disk too
    config = run.manifest().config
    train, pool = load_train_config(config["train"]), load_pool_config(
        {**config["pool"], "max_agents": 1, "agent_timeout_s": 10})
    record = json.loads(Path(train.prompt_data).read_text())
    record["metadata"].update(image=str(tmp_path / "rootfs"),
                              resources={"cpus": 1.0, "mem_mb": 256, "pids": 64, "storage_mb": 48})
    Path(train.prompt_data).write_text(json.dumps(record) + "\n")
    causes = list(BREAKS)

    def choose(request):
        text = upstream.tokenizer.decode(request["input_ids"])
        if "<tool_response>" in text:
            return DONE
        command = BREAKS[causes.pop(0)]
        return {**CALL, "tool_calls": [{**CALL["tool_calls"][0], "function": {"name": "bash",
                                                                             "arguments": {"command": command}}}]}
    with ScriptedUpstream(tiny_model) as upstream:
        upstream.push(*[choose] * 8)
        Registry(run.services_dir).register("inference", 0, host="127.0.0.1", port=int(upstream.url.rsplit(":", 1)[1]))
        ledger = Ledger(run.ledger_dir)
        open_rollout(ledger, PromptSource(load_prompt_rows(train.prompt_data), rollout_batch_size=1), 0,
                     attempts=len(BREAKS), temperature=train.rollout_temperature)

        async def go():
            stop = asyncio.Event()
            serving = asyncio.create_task(PoolWorker(run, pool, train.model, train.prompt_data).serve(stop))
            for _ in range(1200):
                if ledger.status(0).committed == len(BREAKS) or serving.done():
                    break
                await asyncio.sleep(0.1)
            stop.set()
            return await serving
        counts = asyncio.run(go())
    assert counts["committed"] == len(BREAKS) and not counts["infra_failures"] and not counts["errors"], counts
    assert all(c.try_index == 0 for c in ledger.commits(0).values())
    samples = read_rollout(ledger, run.buffer_dir, 0, SAMPLE_CODEC)[0]
    by_attempt = {s.attempt: s for s in samples}
    assert sorted(s.metadata.limits for s in by_attempt.values()) == sorted((c,) for c in BREAKS)
    for s in samples:
        assert s.reward == 0.0 and s.loss_mask.sum() > 0          # trained, as any failed attempt
    for g, a in ledger.commits(0):
        trace = read_record(trace_path(run.trajectories_dir, Claim(0, g, a, ledger.current_generation(0), 0)),
                            AttemptTrace)
        assert tuple(trace.limits) == by_attempt[a].metadata.limits
        if trace.limits == ["storage"]:       # the patch could not be taken: the grade says why
            assert "taking the patch failed at the sandbox's storage limit" in trace.grade.output.text
