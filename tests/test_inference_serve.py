"""The inference role (`agentrl serve`): its config and environment, and the command run as the launcher runs it,
with the CPU engine and with SGLang (the fake of tests/fake_sglang)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from waiting import wait_until

from agentrl.adapter.upstream import parse_generation, sglang_payload
from agentrl.cli import main as agentrl_main
from hpc.inference.cpu_server import ServeOptions
from hpc.inference.serve import (
    CpuServe,
    InferenceConfigError,
    RoleEnv,
    SGLangServe,
    cpu_server_options,
    gpu_shortfall,
    parse_inference,
)
from hpc.launch.distenv import free_port
from hpc.registry import Registry
from hpc.runlayout import RunLayout

pytestmark = pytest.mark.integration

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
FAKE_SGLANG = Path(__file__).resolve().parent / "fake_sglang"


# -- config and environment -------------------------------------------------------------------------------------

def test_role_env_reads_the_launchers_variables():
    env = RoleEnv.from_environ({"AGENTRL_RUN_DIR": "/runs/a", "AGENTRL_ROLE": "inference", "AGENTRL_TASK_INDEX": "3",
                    "CUDA_VISIBLE_DEVICES": "4,5"})
    assert env == RoleEnv(run_dir=Path("/runs/a"), role="inference", task_index=3, visible_gpus=("4", "5"))
    assert RoleEnv.from_environ({}) == RoleEnv()
    assert RoleEnv.from_environ({"CUDA_VISIBLE_DEVICES": ""}).visible_gpus == ()
    with pytest.raises(ValueError, match="AGENTRL_TASK_INDEX='-1' is not a task index"):
        RoleEnv.from_environ({"AGENTRL_TASK_INDEX": "-1"})


def test_an_sglang_section_becomes_each_tasks_server(tmp_path):
    section = {"engine": "sglang", "model": "/models/q", "port": 31000, "tp": 2, "tool_call_parser": "qwen3_coder",
               "container": "/images/sglang.sif", "binds": ["/scratch"], "heartbeat_s": 2}
    cfg = parse_inference(section, index=1)
    assert isinstance(cfg, SGLangServe) and cfg.heartbeat_s == 2 and cfg.health_timeout_s == 1800
    task = cfg.for_task(1, tmp_path / "run")
    assert (task.port, task.tp, task.tool_call_parser, str(task.model_path)) == (31001, 2, "qwen3_coder", "/models/q")
    assert task.binds == ["/scratch", "/models/q", str(tmp_path / "run")]
    assert parse_inference({**section, "container": None}, 0).for_task(0, tmp_path).binds == ["/scratch"]


def test_a_cpu_section_becomes_the_stand_ins_options(tmp_path):
    cfg = parse_inference({"engine": "cpu", "model": "/models/tiny", "port": 30000, "heartbeat_s": 0.5}, 2)
    assert isinstance(cfg, CpuServe)
    assert cpu_server_options(cfg, tmp_path, 2, tmp_path / "alive") == ServeOptions(
        model=Path("/models/tiny"), host="0.0.0.0", port=30002, weight_version="default", register=tmp_path, index=2,
        heartbeat_s=0.5, liveness_file=tmp_path / "alive", threads=1)
    threads = parse_inference({"engine": "cpu", "model": "/m", "threads": 2}, 0)
    assert cpu_server_options(threads, tmp_path, 0).threads == 2
    moe = parse_inference({"engine": "cpu", "model": "/m", "dtype": "bfloat16",
                           "enable_return_routed_experts": True}, 0)
    assert cpu_server_options(moe, tmp_path, 0).dtype == "bfloat16"
    assert cpu_server_options(moe, tmp_path, 0).enable_return_routed_experts is True


@pytest.mark.parametrize("section, index, message", [
    (None, 0, "inference: needs a mapping with engine and model"),
    ({"model": "/m"}, 0, "inference.engine: must be one of sglang, cpu, not None"),
    ({"engine": "vllm", "model": "/m"}, 0, "inference.engine: must be one of sglang, cpu, not 'vllm'"),
    ({"engine": "sglang"}, 0, "inference.model: Field required"),
    ({"engine": "sglang", "model": "/m", "tp": 0}, 0, "inference.tp: Input should be greater than or equal to 1"),
    ({"engine": "sglang", "model": "/m", "reasoning_parser": "r1"}, 0, "inference.reasoning_parser: 'r1' is not"),
    ({"engine": "sglang", "model": "/m", "model_path": "/m"}, 0, "inference.model_path: unknown key"),
    ({"engine": "cpu", "model": "/m", "tp": 2}, 0, "inference.tp: unknown key"),
    ({"engine": "cpu", "model": "/m", "threads": 0}, 0, "inference.threads: Input should be greater than or equal"),
    ({"engine": "cpu", "model": "/m", "port": 65535}, 1, "inference.port: 65535 + task index 1 is above 65535"),
])
def test_bad_sections_name_their_field(section, index, message):
    with pytest.raises(InferenceConfigError) as e:
        parse_inference(section, index)
    assert message in str(e.value)


def test_gpus_for_tp_times_dp():
    cfg = parse_inference({"engine": "sglang", "model": "/m", "tp": 2, "dp": 2}, 0)
    assert gpu_shortfall(cfg, RoleEnv(visible_gpus=("0", "1", "2", "3"))) is None
    assert gpu_shortfall(cfg, RoleEnv(visible_gpus=None)) is None          # unset: SGLang sees the whole node
    assert gpu_shortfall(cfg, RoleEnv(visible_gpus=("0", "1"))) == (
        "inference: tp 2 x dp 2 needs 4 GPUs, this task has 2 (CUDA_VISIBLE_DEVICES=0,1): "
        "raise the role's gpus_per_task or lower tp/dp")


def test_the_command_refuses_what_it_cannot_serve(tmp_path, monkeypatch, capsys):
    for name in ("AGENTRL_RUN_DIR", "AGENTRL_TASK_INDEX", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    assert agentrl_main(["serve"]) == 2
    assert "no run directory: give --run-dir" in capsys.readouterr().err

    monkeypatch.setenv("AGENTRL_RUN_DIR", str(RunLayout.create(tmp_path / "plain", config={"pool": {}}).root))
    assert agentrl_main(["serve"]) == 2
    assert f"{tmp_path / 'plain' / 'run.yaml'}: has no `inference:` section" in capsys.readouterr().err

    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"inference": {"engine": "sglang", "model": "/m", "tp": 2, "dp": 2}}))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert agentrl_main(["serve", "--config", str(config), "--run-dir", str(tmp_path / "new")]) == 2
    assert "inference: tp 2 x dp 2 needs 4 GPUs, this task has 1" in capsys.readouterr().err
    assert RunLayout.open(tmp_path / "new").manifest().config["inference"]["tp"] == 2   # created from the file


# -- the command, as the launcher runs it -----------------------------------------------------------------------


def start_role(run: RunLayout, index: int, **env: str) -> subprocess.Popen:
    environ = {**os.environ, "AGENTRL_RUN_DIR": str(run.root), "AGENTRL_ROLE": "inference",
               "AGENTRL_TASK_INDEX": str(index), "PYTHONPATH": os.pathsep.join([str(FAKE_SGLANG), str(ROOT)]), **env}
    environ.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.Popen([sys.executable, "-m", "agentrl.cli", "serve"], cwd=ROOT, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_registered(registry: Registry, proc: subprocess.Popen, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := registry.services("inference"):
            return found
        if proc.poll() is not None:
            raise AssertionError(f"agentrl serve exited with {proc.returncode}: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError("agentrl serve never registered")


@pytest.mark.parametrize("engine", ["cpu", "sglang"])
def test_serve_registers_answers_and_stops_on_sigterm(engine, tiny_model, tmp_path):
    base = free_port() - 1
    section = {"engine": engine, "model": str(tiny_model), "host": "127.0.0.1", "port": base, "heartbeat_s": 0.2}
    if engine == "sglang":
        section["python"] = sys.executable        # with tests/fake_sglang on PYTHONPATH: the fake sglang
    run = RunLayout.create(tmp_path / "run", config={"inference": section})
    registry = Registry(run.services_dir)
    proc = start_role(run, index=1)
    try:
        [record] = wait_registered(registry, proc)
        assert (record.role, record.index, record.host, record.port) == ("inference", 1, "127.0.0.1", base + 1)
        url = f"http://127.0.0.1:{record.port}"
        reply = httpx.post(f"{url}/generate", json=sglang_payload([5, 6, 7], {"max_new_tokens": 3}), timeout=60)
        assert len(parse_generation(reply.json()).output_ids) == 3
        wait_until(lambda: registry.services("inference")[0].heartbeat > record.heartbeat, 10, "a second heartbeat")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert registry.services("inference") == []
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=5)
    if engine == "sglang":
        assert "inference-1 stopped" in out
        assert "cpu_server: stopped" in (run.logs_dir / "inference-1.sglang.log").read_text()


def test_a_server_that_dies_at_start_exits_1_with_its_log(tmp_path):
    section = {"engine": "sglang", "model": str(tmp_path), "python": sys.executable, "port": free_port()}
    run = RunLayout.create(tmp_path / "run", config={"inference": section})
    proc = start_role(run, index=0, FAKE_SGLANG_FAIL="RuntimeError: no CUDA GPUs are available (fake)")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "exited with 3 before it was healthy" in err and "no CUDA GPUs are available (fake)" in err
    assert Registry(run.services_dir).services() == []


def test_a_bad_config_exits_2_naming_the_field(tmp_path):
    run = RunLayout.create(tmp_path / "run", config={"inference": {"engine": "sglang", "model": "/m", "dp": 0}})
    proc = start_role(run, index=0)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"agentrl serve: {run.manifest_path}: inference.dp: Input should be greater than or equal to 1" in err
