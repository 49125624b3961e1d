"""SGLang's launch command and its validation; the server process's life (start, health, registry, heartbeat with
the weight version, crash, stop) against a fake `sglang` package served by the CPU stand-in; and the same client
contract against real SGLang where there is a GPU and SGLang."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError
from waiting import wait_until

from agentrl.adapter.upstream import parse_generation, sglang_payload
from agentrl.train.publish import publish_weights
from hpc.inference.sglang import (
    ServerError,
    ServerProcess,
    SGLangClient,
    SGLangConfig,
    SGLangError,
    launch_command,
    wait_healthy,
)
from hpc.launch.distenv import free_port
from hpc.procs import group_alive
from hpc.registry import Registry
from hpc.runlayout import RunLayout
from hpc.validation import problems

pytestmark = pytest.mark.integration

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
FAKE_SGLANG = Path(__file__).resolve().parent / "fake_sglang"
PROMPT = [101, 202, 303, 404, 505, 606]
SGLANG_PYTHON = os.environ.get("AGENTRL_SGLANG_PYTHON", "python3")
SGLANG_IMAGE = os.environ.get("AGENTRL_SGLANG_IMAGE")    # containers/sglang.def built; used instead of the python


def fake_env(**extra: str) -> dict[str, str]:
    """The environment in which `python -m sglang.launch_server` is the fake."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKE_SGLANG), str(ROOT)]), **extra}


# -- the command ------------------------------------------------------------------------------------------------

def test_the_default_command():
    assert launch_command(SGLangConfig(model_path=Path("/models/qwen"))) == [
        "python3", "-m", "sglang.launch_server", "--model-path", "/models/qwen", "--tp-size", "1", "--dp-size", "1",
        "--mem-fraction-static", "0.85", "--host", "0.0.0.0", "--port", "30000"]


def test_every_option_becomes_its_flag():
    cmd = launch_command(SGLangConfig(
        model_path=Path("/m"), tp=4, dp=2, mem_fraction_static=0.7, tool_call_parser="qwen3_coder",
        reasoning_parser="qwen3", context_length=65536, host="10.0.0.5", port=31000, weight_version="12",
        skip_server_warmup=True, enable_memory_saver=True, python="/opt/sglang/bin/python"))
    assert cmd[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert {k: flags[k] for k in ("--tp-size", "--dp-size", "--mem-fraction-static", "--tool-call-parser",
                                  "--reasoning-parser", "--context-length", "--host", "--port", "--weight-version")} \
        == {"--tp-size": "4", "--dp-size": "2", "--mem-fraction-static": "0.7", "--tool-call-parser": "qwen3_coder",
            "--reasoning-parser": "qwen3", "--context-length": "65536", "--host": "10.0.0.5", "--port": "31000",
            "--weight-version": "12"}
    assert cmd[-2:] == ["--skip-server-warmup", "--enable-memory-saver"]


def test_a_container_runs_the_interpreter_inside_it():
    cmd = launch_command(SGLangConfig(model_path=Path("/m"), container=Path("/images/sglang.sif"),
                                      binds=["/shared/runs", "/shared/models:/models:ro"]))
    assert cmd[:7] == ["apptainer", "exec", "--nv", "--bind", "/shared/runs,/shared/models:/models:ro",
                       "/images/sglang.sif", "python3"]
    assert cmd[7:9] == ["-m", "sglang.launch_server"]
    assert launch_command(SGLangConfig(model_path=Path("/m"), container=Path("/s.sif")))[:5] == \
        ["apptainer", "exec", "--nv", "/s.sif", "python3"]


def test_extra_args_come_last_and_win():
    cmd = launch_command(SGLangConfig(model_path=Path("/m"), port=30000,
                                      extra_args=["--port", "30100", "--attention-backend", "triton"]))
    assert cmd[-4:] == ["--port", "30100", "--attention-backend", "triton"]
    # argparse, as SGLang parses its flags, keeps a repeated flag's last value.
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int)
    assert ap.parse_known_args(cmd[3:])[0].port == 30100


@pytest.mark.parametrize("fields, field, message", [
    ({"tp": 0}, "tp", "greater than or equal to 1"),
    ({"dp": -1}, "dp", "greater than or equal to 1"),
    ({"mem_fraction_static": 0}, "mem_fraction_static", "greater than 0"),
    ({"mem_fraction_static": 1.5}, "mem_fraction_static", "less than or equal to 1"),
    ({"port": 70000}, "port", "less than or equal to 65535"),
    ({"tool_call_parser": "qwen3-coder"}, "tool_call_parser", "'qwen3-coder' is not one of SGLang 0.5.12's parsers"),
    ({"reasoning_parser": "deepseek_r1"}, "reasoning_parser", "'deepseek_r1' is not one of SGLang 0.5.12's parsers"),
    ({"colour": "red"}, "colour", "unknown key"),
])
def test_bad_settings_name_their_field(fields, field, message):
    with pytest.raises(ValidationError) as e:
        SGLangConfig(model_path=Path("/m"), **fields)
    [(loc, msg)] = problems(e.value)
    assert loc == field and message in msg


def test_a_parser_error_lists_the_known_names():
    with pytest.raises(ValidationError) as e:
        SGLangConfig(model_path=Path("/m"), tool_call_parser="qwen3-coder")
    assert "qwen3_coder" in str(e.value) and "extra_args" in str(e.value)


# -- the process, with the fake sglang --------------------------------------------------------------------------

def fake_config(model: Path, **fields) -> SGLangConfig:
    return SGLangConfig(model_path=model, python=sys.executable, host="127.0.0.1", port=free_port(), **fields)


def server_process(cfg: SGLangConfig, run: RunLayout, env: dict[str, str], index: int = 0) -> ServerProcess:
    return ServerProcess(launch_command(cfg), host=cfg.host, port=cfg.port, env=env,
                         log_path=run.logs_dir / f"inference-{index}.sglang.log", registry=Registry(run.services_dir),
                         index=index, heartbeat_s=0.2, poll_s=0.05, health_timeout_s=600, grace_s=10)


def check_client_contract(cfg: SGLangConfig, env: dict[str, str], model: Path, run: RunLayout) -> None:
    """What the rollout and the trainer need of a server, whichever engine serves."""
    registry = Registry(run.services_dir)
    with server_process(cfg, run, env, index=1) as server:
        assert server.start()
        [record] = registry.services("inference")
        assert (record.index, record.host, record.port, record.weight_version) == (1, "127.0.0.1", cfg.port, None)
        serving = threading.Thread(target=server.serve, daemon=True)
        serving.start()

        body = sglang_payload(PROMPT, {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
        gen = parse_generation(httpx.post(f"{server.url}/generate", json=body, timeout=120).json())
        assert len(gen.output_ids) == len(gen.logprobs) == 8 and all(lp <= 0 for lp in gen.logprobs)
        assert (gen.finish_reason, gen.weight_version) == ("length", "default")

        publish_weights([server.url], model, 7, timeout_s=300)
        assert parse_generation(httpx.post(f"{server.url}/generate", json=body, timeout=120).json()) \
            .weight_version == "7"
        wait_until(lambda: registry.services("inference")[0].weight_version == 7, 20, "the heartbeat of version 7")

        server.request_stop()
        serving.join(10)
        assert not serving.is_alive()
        pgid = server.proc.pid
    assert registry.services("inference") == []
    assert server.proc.returncode is not None and not group_alive(pgid)


def test_the_server_lives_registers_reloads_and_stops(tiny_model, tmp_path):
    run = RunLayout.create(tmp_path / "run")
    check_client_contract(fake_config(tiny_model), fake_env(), tiny_model, run)
    log = (run.logs_dir / "inference-1.sglang.log").read_text()
    assert "-m sglang.launch_server --model-path" in log and "fake sglang:" in log


def test_a_server_that_cannot_start_fails_fast_with_its_log(tmp_path):
    run = RunLayout.create(tmp_path / "run")
    cfg = fake_config(tmp_path / "no-model")
    started = time.monotonic()
    with server_process(cfg, run, fake_env(FAKE_SGLANG_FAIL="RuntimeError: CUDA out of memory (fake)")) as server:
        with pytest.raises(ServerError, match=r"exited with 3 before it was healthy(.|\n)*CUDA out of memory"):
            server.start()
    assert time.monotonic() - started < 30        # the exit is noticed, not the 600 s timeout
    assert Registry(run.services_dir).services() == []


def test_a_crash_while_serving_is_reported_and_deregistered(tiny_model, tmp_path):
    run = RunLayout.create(tmp_path / "run")
    registry = Registry(run.services_dir)
    with server_process(fake_config(tiny_model), run, fake_env()) as server:
        assert server.start() and len(registry.services("inference")) == 1
        os.kill(server.proc.pid, signal.SIGKILL)
        with pytest.raises(ServerError, match=r"exited with -9; the end of .*inference-0.sglang.log"):
            server.serve()
    assert registry.services("inference") == []


def test_wait_healthy_times_out_or_is_cancelled(tmp_path):
    silent = subprocess.Popen(["sleep", "30"])
    try:
        url = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(ServerError, match="was not healthy after 0 s"):
            wait_healthy(url, 0.3, silent, poll_s=0.05)
        assert wait_healthy(url, 60, silent, poll_s=0.05, cancelled=lambda: True) is None
    finally:
        silent.kill()
        silent.wait()


def test_no_heartbeat_while_the_server_does_not_answer(tmp_path):
    registry = Registry(tmp_path / "services")
    server = ServerProcess(["true"], port=30000, log_path=tmp_path / "log", registry=registry)
    server.record = record = registry.register("inference", 0, host="gpu1", port=30000, weight_version=3)
    down = SGLangClient(server.url, transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    assert not server.heartbeat(down)
    assert registry.services()[0].heartbeat == record.heartbeat
    up = SGLangClient(server.url, transport=httpx.MockTransport(
        lambda r: httpx.Response(200, json={"weight_version": "4"})))
    assert server.heartbeat(up)
    assert registry.services()[0].weight_version == 4


def test_the_client_probes_quietly_and_its_control_calls_name_the_server():
    asked: list[str] = []

    def old_sglang(request: httpx.Request) -> httpx.Response:     # knows only /get_model_info
        asked.append(request.url.path)
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json={"weight_version": "7"})
        return httpx.Response(404 if request.url.path == "/model_info" else 500, text="no")

    client = SGLangClient("http://gpu1:30000/", transport=httpx.MockTransport(old_sglang))
    assert client.model_info() == {"weight_version": "7"} and client.weight_version() == "7"
    assert asked == ["/model_info", "/get_model_info"] * 2
    assert not client.healthy()
    with pytest.raises(SGLangError, match=r"^http://gpu1:30000/pause_generation answered 500: no$"):
        client.pause()
    unreachable = SGLangClient("http://gpu1:30000", transport=httpx.MockTransport(
        lambda r: (_ for _ in ()).throw(httpx.ConnectError("refused"))))
    assert unreachable.model_info() is None and not unreachable.healthy()
    with pytest.raises(SGLangError, match="http://gpu1:30000/model_info: ConnectError"):
        unreachable.weight_version()


# -- real SGLang ------------------------------------------------------------------------------------------------

def why_no_real_sglang() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "needs an NVIDIA GPU: nvidia-smi is not on PATH"
    if subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode != 0:
        return "needs an NVIDIA GPU: `nvidia-smi -L` fails"
    python = ["apptainer", "exec", "--nv", SGLANG_IMAGE, "python3"] if SGLANG_IMAGE else [SGLANG_PYTHON]
    try:
        r = subprocess.run([*python, "-c", "import sglang"], capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        return f"needs SGLang: {python[0]!r} is not installed (set AGENTRL_SGLANG_PYTHON or AGENTRL_SGLANG_IMAGE)"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return (f"needs SGLang: `{' '.join(python)} -c 'import sglang'` fails ({last}); "
                "set AGENTRL_SGLANG_PYTHON or AGENTRL_SGLANG_IMAGE")
    return None


NO_REAL_SGLANG = why_no_real_sglang()


@pytest.mark.integration
@pytest.mark.skipif(NO_REAL_SGLANG is not None, reason=NO_REAL_SGLANG or "")
def test_real_sglang_keeps_the_client_contract(tiny_model, tmp_path):
    run = RunLayout.create(tmp_path / "run")
    where = {"container": Path(SGLANG_IMAGE), "binds": [str(tiny_model), str(run.root)]} if SGLANG_IMAGE \
        else {"python": SGLANG_PYTHON}
    # The tiny model's head_dim is 16: the triton attention backend takes it; CUDA graphs only slow the start.
    cfg = SGLangConfig(model_path=tiny_model, host="127.0.0.1", port=free_port(), mem_fraction_static=0.3,
                       extra_args=["--attention-backend", "triton", "--disable-cuda-graph"], **where)
    check_client_contract(cfg, dict(os.environ), tiny_model, run)
