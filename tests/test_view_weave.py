"""agentrl view --weave: a run's attempts logged through the real weave library, then queried back.

The Weave project is one weave's own tests use: its in-process SQLite trace server
(weave.trace_server.sqlite_trace_server), behind the adapter weave puts between its client and a server
(external_to_internal_trace_server_adapter), under a real WeaveClient. weave ships that server in its
wheel up to 0.52.42 (constraints.txt pins it), and it imports packages of weave's trace-server extra
(ddtrace, clickhouse-connect, redis, sqlparse, emoji: the extra `weave-test`). No network: nothing
leaves the process. Where it cannot be had the Weave tests skip, saying why, and fail under CI. The
refusals (W&B offline, no weave package) need no weave at all.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from ci import skip_or_fail
from view_runs import SYSTEM, CharTokenizer, Script, commit_attempt, make_rollout

from agentrl.cli import main
from agentrl.view.read import open_source
from agentrl.view.tokens import Decoder
from agentrl.view.weave_export import RECORD, export_weave
from hpc.runlayout import RunLayout

# weave 0.52.42's own request models warn of their deprecated fields as the client fills them in
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:weave.trace_server.trace_server_interface")

TOKENIZER = CharTokenizer()
DECODER = Decoder(TOKENIZER)
ONLINE = {"wandb": "online", "entity": "ent", "project": "proj"}
SCRIPTS = {(0, 0): Script("alpha"), (0, 1): Script("alpha", reward=0.0, patch=""),
           (1, 0): Script("beta", fork=True), (1, 1): Script("beta", reward=0.0, retry=True)}
SERVER_SETUP = ("pip install -c constraints.txt '.[weave,weave-test]' (make venv): weave 0.52.42, the last "
                "release whose wheel ships its in-process SQLite trace server, and the packages that server imports")


def new_run(root: Path, tracking: dict[str, Any] | None = None) -> RunLayout:
    """view_runs.new_run's run, with a W&B configuration (train.tracking) in its run.yaml."""
    return RunLayout.create(root, config={"train": {"tracking": tracking} if tracking is not None else {},
                                          "pool": {"tool_parser": "qwen3_coder", "reasoning_parser": "qwen3"}},
                            run_id="view-test")


# ---------------------------------------------------------------- the refusals: no weave needed


@pytest.mark.parametrize("mode", [None, "offline", "disabled"])
def test_weave_refuses_unless_w_and_b_is_online_and_does_nothing_else(tmp_path, capsys, mode):
    run = new_run(tmp_path / "run", None if mode is None else {"wandb": mode})
    make_rollout(run, 0, {(0, 0): Script("alpha")}, TOKENIZER.encode)
    assert main(["view", str(run.root), "--weave", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--weave needs online W&B" in err and repr(mode or "offline") in err
    assert not (run.root / "view").exists()          # not even the site: nothing else was done


def test_weave_without_the_extra_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    run = new_run(tmp_path / "run", ONLINE)
    make_rollout(run, 0, {(0, 0): Script("alpha")}, TOKENIZER.encode)
    monkeypatch.setitem(sys.modules, "weave", None)      # `import weave` raises ImportError, as where it is absent
    assert main(["view", str(run.root), "--weave", "--quiet"]) == 2
    assert "pip install 'agentrl-hpc[weave]'" in capsys.readouterr().err
    assert not (run.root / "view").exists()


def test_weave_tokens_and_wandb_mode_go_with_weave(tmp_path, capsys):
    run = new_run(tmp_path / "run", ONLINE)
    assert main(["view", str(run.root), "--weave-tokens", "--quiet"]) == 2
    assert "--weave-tokens goes with --weave" in capsys.readouterr().err
    assert main(["view", str(run.root), "--wandb-mode", "online", "--quiet"]) == 2
    assert "--wandb-mode goes with --weave" in capsys.readouterr().err


def test_an_offline_run_says_how_to_export_it_and_wandb_mode_offline_is_refused(tmp_path, capsys):
    run = new_run(tmp_path / "run", {**ONLINE, "wandb": "offline"})
    make_rollout(run, 0, {(0, 0): Script("alpha")}, TOKENIZER.encode)
    assert main(["view", str(run.root), "--weave", "--quiet"]) == 2
    assert "with --wandb-mode online" in capsys.readouterr().err
    assert main(["view", str(run.root), "--weave", "--wandb-mode", "offline", "--quiet"]) == 2
    assert "--wandb-mode is 'offline'" in capsys.readouterr().err
    assert not (run.root / "view").exists()


def test_without_the_flag_nothing_changes_and_weave_is_never_imported(tmp_path, capsys, monkeypatch):
    run = new_run(tmp_path / "run", ONLINE)
    make_rollout(run, 0, {(0, 0): Script("alpha")}, TOKENIZER.encode)
    monkeypatch.setitem(sys.modules, "weave", None)
    assert main(["view", str(run.root), "--quiet"]) == 0
    assert (run.root / "view" / "rollout_0" / "0-0.html").exists() and not (run.root / "view" / RECORD).exists()
    assert "Weave" not in capsys.readouterr().out


# ---------------------------------------------------------------- into weave's in-process trace server


@pytest.fixture
def weave_client(tmp_path, monkeypatch):
    """A WeaveClient of project ent/proj on weave's SQLite trace server in tmp_path, as weave's tests make one."""
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")       # weave's Sentry: nothing leaves the process
    # Requests in line, in order: weave's SQLite server drops the end of a call whose start it has not yet
    # stored, and the client's thread pools may deliver them the other way round (weave's own tests
    # serialize them by flushing after every call: TestOnlyFlushingWeaveClient).
    monkeypatch.setenv("WEAVE_CLIENT_PARALLELISM", "0")
    try:
        from weave.trace.context.weave_client_context import set_weave_client_global
        from weave.trace.weave_client import WeaveClient
        from weave.trace_server.external_to_internal_trace_server_adapter import ExternalTraceServer, IdConverter
        from weave.trace_server.sqlite_trace_server import SqliteTraceServer
    except ImportError as e:
        problem = f"weave's in-process trace server cannot be imported ({e}): {SERVER_SETUP}"
        skip_or_fail("the Weave tests", problem)

    class Ids(IdConverter):
        """Project ids as weave's own test adapter writes them inside the server (base64); runs and users as given."""

        def ext_to_int_project_id(self, project_id: str) -> str:
            return base64.b64encode(project_id.encode()).decode()

        def int_to_ext_project_id(self, project_id: str) -> str | None:
            return base64.b64decode(project_id.encode()).decode()

        def ext_to_int_run_id(self, run_id: str) -> str:
            return run_id

        def int_to_ext_run_id(self, run_id: str) -> str:
            return run_id

        def ext_to_int_user_id(self, user_id: str) -> str:
            return user_id

        def int_to_ext_user_id(self, user_id: str) -> str:
            return user_id

    server = SqliteTraceServer(str(tmp_path / "weave.db"))
    server.setup_tables()
    client = WeaveClient("ent", "proj", ExternalTraceServer(server, Ids()), ensure_project_exists=False)
    set_weave_client_global(client)      # what weave.init does: calls are logged to the global client
    try:
        yield client
    finally:
        client.flush()
        set_weave_client_global(None)
        server.close()


def plain(value: Any) -> Any:
    """A value read back from weave (WeaveDict, WeaveList) as plain dicts and lists."""
    if hasattr(value, "items"):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "WeaveList":
        return [plain(v) for v in value]
    return value


def calls_of(client) -> list[dict[str, Any]]:
    """Every call of the project, in the order they started."""
    out = [{"op": c.op_name.split("/op/", 1)[1].split(":", 1)[0], "id": c.id, "parent": c.parent_id,
            "inputs": plain(c.inputs), "output": plain(c.output), "name": c.display_name, "started": c.started_at}
           for c in client.get_calls()]
    return sorted(out, key=lambda c: c["started"])


def children(calls: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in calls if c["parent"] == parent["id"]]


def root_of(calls: list[dict[str, Any]], group: int, attempt: int) -> dict[str, Any]:
    (root,) = [c for c in calls if c["parent"] is None and (c["inputs"]["group"], c["inputs"]["attempt"]) ==
               (group, attempt)]
    return root


def turns_only(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in calls if c["op"] == "agentrl.turn"]


@pytest.mark.integration
def test_each_attempt_is_one_call_tree_its_turns_and_tool_results_in_order(tmp_path, weave_client):
    run = new_run(tmp_path / "run", ONLINE)
    make_rollout(run, 0, SCRIPTS, TOKENIZER.encode)
    stats = export_weave(open_source(run.root), run.root / "view", weave_client, "ent/proj", decoder=DECODER)
    assert (stats.logged, stats.before) == (4, 0)
    calls = calls_of(weave_client)
    roots = [c for c in calls if c["parent"] is None]
    assert sorted((c["op"], c["inputs"]["group"], c["inputs"]["attempt"]) for c in roots) == \
        [("agentrl.attempt", g, a) for g, a in sorted(SCRIPTS)]

    root = root_of(calls, 0, 0)
    assert {k: root["inputs"][k] for k in ("run", "task", "rollout", "group", "attempt", "try")} == \
        {"run": "view-test", "task": "alpha", "rollout": 0, "group": 0, "attempt": 0, "try": 0}
    out = root["output"]
    assert out["reward"] == 1.0 and out["patch"] == Script("alpha").patch
    assert out["grade"]["reward"] == 1.0 and out["grade"]["output"] == Script("alpha").grade_output
    assert out["grade"]["exit_code"] == 0 and out["agent"]["final_text"] == "Fixed it."
    assert out["facts"]["empty_patch"] == "not_triggered" and out["facts"]["tool_calls"] == 1
    assert root_of(calls, 0, 1)["output"]["reward"] == 0.0 and root_of(calls, 0, 1)["output"]["patch"] == ""

    (sample,) = children(calls, root)
    assert (sample["op"], sample["inputs"]) == ("agentrl.sample", {"sample": 0, "start": "first"})
    first, tool, second = children(calls, sample)
    assert [c["op"] for c in (first, tool, second)] == ["agentrl.turn", "agentrl.tool", "agentrl.turn"]
    assert first["inputs"]["turn"] == 1 and first["inputs"]["messages"] == [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Solve alpha."}]
    assert first["output"]["reasoning"] == "Look first." and first["output"]["trained"] is True
    assert first["output"]["tool_calls"] == [{"name": "bash", "arguments": {"command": "cat a.py"}}]
    assert tool["inputs"] == {"name": "bash", "arguments": {"command": "cat a.py"}}
    assert tool["output"] == {"content": Script("alpha").tool_output}
    assert second["inputs"] == {"sample": 0, "turn": 2, "messages": []}
    assert (second["output"]["content"], second["output"]["drift"], second["output"]["weight_version"]) == \
        ("Fixed it.", "clean", 3)
    assert sample["output"]["reward"] == 1.0 and sample["output"]["turns"] == 2

    # a fork is a sample of its own, its first turn given the compacted history
    fork_root = root_of(calls, 1, 0)
    first_sample, forked = children(calls, fork_root)
    assert forked["inputs"] == {"sample": 1, "start": "fork"}
    (fork_turn,) = turns_only(children(calls, forked))
    assert fork_turn["output"]["content"] == "Done." and fork_turn["output"]["drift"] == "fork"
    assert fork_turn["inputs"]["messages"][-1] == {"role": "user", "content": "Summary so far."}
    # a retried call: a branch, whose shared first turn is trained in the first sample only
    retry_root = root_of(calls, 1, 1)
    trunk, branch = children(calls, retry_root)
    assert branch["inputs"] == {"sample": 1, "start": "branch"}
    assert [t["output"]["trained"] for t in turns_only(children(calls, branch))] == [False, True]
    assert turns_only(children(calls, branch))[-1]["output"]["content"] == "Retried: Fixed it."

    # token ids only when asked
    assert not any("tokens" in c["output"] for c in calls if c["op"] == "agentrl.turn")
    record = json.loads((run.root / "view" / RECORD).read_text())
    assert record["projects"]["ent/proj"] == {f"rollout_0/g1/{g}-{a}-0": root_of(calls, g, a)["id"]
                                              for g, a in SCRIPTS}


@pytest.mark.integration
def test_token_ids_go_when_asked_with_their_pieces_log_probs_and_loss_mask(tmp_path, weave_client):
    run = new_run(tmp_path / "run", ONLINE)
    make_rollout(run, 0, {(0, 0): Script("alpha")}, TOKENIZER.encode, attempts=1)
    export_weave(open_source(run.root), run.root / "view", weave_client, "ent/proj", decoder=DECODER, tokens=True)
    calls = calls_of(weave_client)
    first, second = turns_only(calls)
    tokens = second["output"]["tokens"]
    assert tokens["ids"] == TOKENIZER.encode("Fixed it.<|im_end|>")
    assert "".join(tokens["pieces"]) == "Fixed it.<|im_end|>" and set(tokens["loss_mask"]) == {1}
    assert tokens["logprobs"] == pytest.approx([-0.25 - (i % 7) / 10 for i in range(len(tokens["ids"]))])
    assert TOKENIZER.decode(first["output"]["tokens"]["ids"]).startswith("<think>\nLook first.")


@pytest.mark.integration
def test_a_re_export_logs_nothing_again_and_a_new_commit_once(tmp_path, weave_client):
    run = new_run(tmp_path / "run", ONLINE)
    scripts = {(0, 0): Script("alpha"), (0, 1): Script("alpha", reward=0.0)}
    ledger, pending = make_rollout(run, 0, scripts, TOKENIZER.encode, commit={(0, 0)})
    source, out = open_source(run.root), run.root / "view"
    assert export_weave(source, out, weave_client, "ent/proj", decoder=DECODER).logged == 1
    n = len(calls_of(weave_client))
    again = export_weave(source, out, weave_client, "ent/proj", decoder=DECODER)
    assert (again.logged, again.before) == (0, 1) and len(calls_of(weave_client)) == n

    commit_attempt(run, ledger, pending[(0, 1)], scripts[(0, 1)], TOKENIZER.encode)     # the run went on
    later = export_weave(source, out, weave_client, "ent/proj", decoder=DECODER)
    assert (later.logged, later.before) == (1, 1)
    roots = [c for c in calls_of(weave_client) if c["parent"] is None]
    assert sorted(c["inputs"]["attempt"] for c in roots) == [0, 1]
    assert sorted(json.loads((out / RECORD).read_text())["projects"]["ent/proj"]) == \
        ["rollout_0/g1/0-0-0", "rollout_0/g1/0-1-0"]


@pytest.mark.integration
def test_the_command_logs_into_the_project_the_run_names(tmp_path, weave_client, capsys, monkeypatch):
    """`agentrl view RUN --weave`: weave.init is handed train.tracking's entity/project (and gives the client
    on weave's SQLite server: no W&B account here); a second run of it logs nothing."""
    import weave

    opened = []

    def init(project: str, **kwargs: Any):
        opened.append((project, kwargs.get("settings")))
        return weave_client

    monkeypatch.setattr(weave, "init", init)
    run = new_run(tmp_path / "run", ONLINE)
    make_rollout(run, 0, SCRIPTS, TOKENIZER.encode)
    assert main(["view", str(run.root), "--weave", "--weave-tokens", "--quiet"]) == 0
    assert opened == [("ent/proj", {"print_call_link": False, "implicitly_patch_integrations": False})]
    assert "4 attempts logged to Weave project ent/proj" in capsys.readouterr().out
    assert (run.root / "view" / "rollout_0" / "0-0.html").exists()      # the site as ever
    calls = calls_of(weave_client)
    assert len([c for c in calls if c["parent"] is None]) == 4
    # no tokenizer here (run.yaml names no model): the turns are there undecoded, their ids as asked
    turn = turns_only(calls)[0]
    assert turn["output"]["content"] == "" and turn["output"]["tokens"]["ids"]
    assert main(["view", str(run.root), "--weave", "--quiet"]) == 0
    assert "0 attempts logged to Weave project ent/proj (4 logged before)" in capsys.readouterr().out
    assert len(calls_of(weave_client)) == len(calls)

    # A run trained offline, exported from a node with network: --wandb-mode online, into the project it names
    offline = new_run(tmp_path / "offline", {**ONLINE, "wandb": "offline", "project": "later"})
    make_rollout(offline, 0, {(0, 0): Script("alpha")}, TOKENIZER.encode)
    assert main(["view", str(offline.root), "--weave", "--wandb-mode", "online", "--quiet"]) == 0
    assert opened[-1][0] == "ent/later" and "1 attempts logged to Weave project ent/later" in capsys.readouterr().out
