"""Publishing weights while servers die and come back: a restarting server never ends the run, a refusal does."""

import json
from pathlib import Path

import httpx
import pytest

from agentrl.train.publish import PublishError, publish_weights
from hpc.inference.sglang import SGLangClient

MODEL = Path("/ckpt/iter_3/hf")


class Server:
    """An SGLang server's control API, in memory: `down` rounds of connection errors (it is restarting, and
    comes back with `restarted_version` loaded by itself), or a refusal of every load."""

    def __init__(self, version: str = "2", down: int = 0, restarted_version: str | None = None, refuse=False):
        self.version, self.down, self.restarted_version, self.refuse = version, down, restarted_version, refuse
        self.calls: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            self.down -= 1
            if not self.down and self.restarted_version:
                self.version = self.restarted_version
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path.strip("/")
        self.calls.append(path)
        if path == "model_info":
            return httpx.Response(200, json={"weight_version": self.version})
        if path == "update_weights_from_disk":
            if self.refuse:
                return httpx.Response(400, json={"error": {"message": "out of memory"}})
            self.version = json.loads(request.content)["weight_version"]
        return httpx.Response(200, json={"success": True})


def clients(servers: dict[str, Server]):
    return lambda url: SGLangClient(url, transport=httpx.MockTransport(servers[url]))


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_a_server_restarting_mid_publish_is_waited_for_and_not_reloaded_twice():
    servers = {"http://a": Server(), "http://b": Server(down=3, restarted_version="3")}
    clock = Clock()
    times = publish_weights(lambda: list(servers), MODEL, 3, client=clients(servers), clock=clock, sleep=clock.sleep)
    assert set(times) == {"http://a", "http://b"} and clock.now == 3.0   # asked again once a second
    assert servers["http://a"].calls == ["pause_generation", "update_weights_from_disk", "flush_cache",
                                         "continue_generation", "model_info"]
    assert servers["http://b"].calls == ["model_info"]       # it came back with the published weights


def test_a_server_that_comes_back_with_old_weights_is_reloaded():
    servers = {"http://b": Server(down=1, restarted_version="2")}
    clock = Clock()
    publish_weights(lambda: list(servers), MODEL, 3, client=clients(servers), clock=clock, sleep=clock.sleep)
    assert servers["http://b"].version == "3" and "update_weights_from_disk" in servers["http://b"].calls


def test_a_server_that_is_no_longer_live_is_left_out():
    servers = {"http://a": Server(), "http://b": Server(down=100)}
    live = ["http://a", "http://b"]
    clock = Clock()

    def sleep(s):
        clock.sleep(s)
        live.remove("http://b")          # its heartbeat went stale: the registry no longer lists it

    assert set(publish_weights(lambda: live, MODEL, 3, client=clients(servers), clock=clock, sleep=sleep)) == \
        {"http://a"}


def test_a_refusal_fails_at_once_and_a_server_unreachable_past_the_timeout_fails_naming_it():
    servers = {"http://a": Server(refuse=True), "http://b": Server(down=100)}
    clock = Clock()
    with pytest.raises(PublishError, match=r"v3 did not reach every server:\n  http://a: .*answered 400"):
        publish_weights(list(servers), MODEL, 3, client=clients(servers), clock=clock, sleep=clock.sleep)
    assert clock.now == 0.0
    with pytest.raises(PublishError, match=r"http://b: http://b/model_info: ConnectError"):
        publish_weights(["http://b"], MODEL, 3, client=clients(servers), clock=clock, sleep=clock.sleep,
                        timeout_s=10)
    assert clock.now == 10.0
