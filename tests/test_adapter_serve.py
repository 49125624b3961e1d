"""The adapter as a real server: `agentrl adapter serve` on TCP and a Unix socket, client hang-ups."""

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from scripted_upstream import ScriptedUpstream
from waiting import wait_until

from agentrl.adapter.serve import AdapterServer
from agentrl.adapter.service import Adapter, AdapterConfig
from agentrl.adapter.upstream import UpstreamError

pytestmark = pytest.mark.integration

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
DONE = {"role": "assistant", "content": "Done."}
BODY = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}


def test_serve_command_answers_on_tcp_and_on_its_unix_socket(tiny_model, tmp_path):
    sock, token_file = tmp_path / "adapter.sock", tmp_path / "control"
    with ScriptedUpstream(tiny_model, [DONE, DONE]) as upstream:
        proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "adapter", "serve", "--upstream", upstream.url,
                                 "--tokenizer", str(tiny_model), "--port", "0", "--uds", str(sock),
                                 "--open-unknown-keys", "--control-token-file", str(token_file)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            line = proc.stdout.readline()
            assert line.startswith("agentrl adapter listening on http://127.0.0.1:"), proc.stderr.read()
            url = line.split()[4]
            tcp = httpx.post(f"{url}/v1/messages", json=BODY, headers={"x-api-key": "mine"}, timeout=30)
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://adapter") as c:
                unix = c.post("/v1/chat/completions", json=BODY, headers={"Authorization": "Bearer other"})
            assert oct(sock.stat().st_mode & 0o777) == "0o666"       # the agent (uid 1000) connects to it
            assert oct(token_file.stat().st_mode & 0o777) == "0o600"
            ctl = {"x-agentrl-control": token_file.read_text().strip()}
            done = httpx.post(f"{url}/_agentrl/finish_session", json={"key": "mine"}, headers=ctl, timeout=30)
            denied = httpx.post(f"{url}/_agentrl/finish_session", json={"key": "other"}, timeout=30)
        finally:
            proc.terminate()
            proc.wait(10)
    assert tcp.json()["content"] == [{"type": "text", "text": "Done."}]
    assert unix.json()["choices"][0]["message"]["content"] == "Done."
    assert done.status_code == 200 and len(done.json()["samples"]) == 1 and denied.status_code == 403


def test_serve_command_refuses_bad_config_with_the_field_named(tmp_path):
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "adapter", "serve", "--upstream", "localhost:30000",
                        "--tokenizer", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "upstreams: upstream URLs must start with http://" in r.stderr
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "adapter", "serve", "--upstream", "http://x",
                        "--tokenizer", str(tmp_path), "--tool-parser", "xml"], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "qwen3_coder" in r.stderr and str(tmp_path) not in r.stderr.split("xml")[0]


def test_a_client_hanging_up_aborts_its_turn_and_others_go_on(tiny_model):
    # the slow turn outlasts any delay a loaded machine adds: the abort must come while it is still on
    with ScriptedUpstream(tiny_model, [dict(DONE, delay_s=60), DONE]) as upstream:
        adapter = Adapter(AdapterConfig(tokenizer=tiny_model, upstreams=[upstream.url]))
        with AdapterServer(adapter) as server:
            impatient = adapter.sessions.open().key
            patient = adapter.sessions.open().key
            try:
                httpx.post(f"{server.url}/v1/messages", json=BODY, headers={"x-api-key": impatient}, timeout=0.5)
                raise AssertionError("the slow turn answered")
            except httpx.TimeoutException:
                pass
            wait_until(lambda: adapter_stats(server)["client_aborts"] >= 1, 30, "the adapter to count the abort")
            answered_at_abort = list(upstream.answered)
            ok = httpx.post(f"{server.url}/v1/messages", json=BODY, headers={"x-api-key": patient}, timeout=30)
            stats = adapter_stats(server)
    assert stats["client_aborts"] == 1 and answered_at_abort == []      # counted before the model answered
    assert ok.status_code == 200
    assert adapter.sessions.get(impatient).tree.turns == 0         # an aborted turn is not recorded
    assert adapter.sessions.get(patient).tree.turns == 1


def adapter_stats(server) -> dict:
    return httpx.get(f"{server.url}/healthz", timeout=5).json()


def test_registry_heartbeats_decide_which_servers_are_live(tmp_path):
    from agentrl.adapter.upstream import UpstreamPool, registry_servers
    from hpc.registry import Registry

    clock = [1000.0]
    reg = Registry(tmp_path / "services", clock=lambda: clock[0])
    a = reg.register("inference", 0, host="127.0.0.1", port=30000)
    reg.register("inference", 1, host="127.0.0.1", port=30001)
    clock[0] += 25
    reg.heartbeat(a)
    clock[0] += 10
    pool = UpstreamPool(registry_servers(reg, ttl_s=30, clock=lambda: clock[0]))
    assert {pool.pick() for _ in range(4)} == {"http://127.0.0.1:30000"}
    reg.deregister(a)
    clock[0] += 1.1      # the registry is re-read at most once a second
    try:
        pool.pick()
        raise AssertionError("picked a server with none live")
    except UpstreamError as e:
        assert "no model server is live" in str(e)


def test_the_config_takes_a_runs_registry(tiny_model, tmp_path):
    import pytest
    from pydantic import ValidationError

    (tmp_path / "run/services").mkdir(parents=True)
    cfg = AdapterConfig(tokenizer=tiny_model, registry=tmp_path / "run")
    assert callable(cfg.servers()) and cfg.servers()() == []
    with pytest.raises(ValidationError, match="no services/ directory"):
        AdapterConfig(tokenizer=tiny_model, registry=tmp_path)
    for neither_or_both in ({}, {"upstreams": ["http://a:1"], "registry": tmp_path / "run"}):
        with pytest.raises(ValidationError, match="upstreams.*or a run directory .registry., one of the two"):
            AdapterConfig(tokenizer=tiny_model, **neither_or_both)
    with pytest.raises(ValidationError, match="must start with http"):       # the old spelling, in a config
        AdapterConfig(tokenizer=tiny_model, upstreams=[f"registry:{tmp_path / 'run'}"])


def test_a_socket_path_longer_than_a_unix_address_holds_is_refused_before_anything_starts(tmp_path):
    """The bound is the kernel's: a path of UDS_PATH_MAX bytes binds, one byte more does not, and the
    adapter refuses that one up front, naming the setting to shorten."""
    import socket

    from agentrl.adapter.serve import UDS_PATH_MAX, check_socket_path

    def path_of(size: int) -> str:
        base = str(tmp_path) + "/"
        return base + "s" * (size - len(base))

    fits, too_long = path_of(UDS_PATH_MAX), path_of(UDS_PATH_MAX + 1)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(fits)
    with socket.socket(socket.AF_UNIX) as s, pytest.raises(OSError):
        s.bind(too_long)
    check_socket_path(fits)
    with pytest.raises(ValueError, match=rf"is a path of {UDS_PATH_MAX + 1} bytes, .*pool.scratch_dir"):
        AdapterServer(None, uds=too_long)      # type: ignore[arg-type]   refused before the adapter is touched
