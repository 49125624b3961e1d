"""An installed wheel works outside the checkout: every file the packages read at run time is package data.

The wheel is built from the files git would commit (tracked, plus untracked ones that are not ignored),
installed with its dependencies into a fresh venv in a temporary directory, and run from another
temporary directory without PYTHONPATH: the CLI, `tasks check` of a bundled task in real bwrap
sandboxes, the tiny model's tokenizer with its chat template, the harness pins and files,
`agentrl cluster status|env` and `agentrl view` (its templates). Nothing of the checkout is on any path,
so a file that only the checkout has fails here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrl.harness.install import PINNED_CLIS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Installed:
    venv: Path
    cwd: Path             # a directory outside the checkout, for every command
    env: dict[str, str]   # no PYTHONPATH, no venv of the checkout on PATH

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run(self, *argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in argv], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def python_c(self, code: str, *args: str | Path, timeout: float = 120) -> str:
        r = self.run(self.python, "-c", textwrap.dedent(code), *args, timeout=timeout)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def agentrl(self, *args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.run(self.venv / "bin" / "agentrl", *args, timeout=timeout)


def progress(message: str, since: float) -> None:
    print(f"test_wheel: {message} ({time.monotonic() - since:.1f} s)", flush=True)


def committed_tree(dest: Path) -> Path:
    """A copy of the files git would commit: what a clean checkout, and so a release, builds from. Building
    from it also keeps the wheel build's build/ and egg-info out of the shared working tree."""
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"test_wheel builds from the git checkout {ROOT}: git ls-files failed: {r.stderr}"
    for rel in filter(None, r.stdout.split("\0")):
        source = ROOT / rel
        if source.is_file() or source.is_symlink():   # a tracked file deleted in the work tree is not copied
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel, follow_symlinks=False)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    assert not base.resolve().is_relative_to(ROOT), f"the temporary directory {base} is inside the checkout"
    t0 = time.monotonic()
    wheels = base / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(wheels), str(committed_tree(base / "src"))], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (wheel,) = wheels.glob("agentrl_hpc-*.whl")
    progress(f"built {wheel.name}", t0)

    # No pip in the fresh venv (ensurepip takes seconds): this interpreter's pip installs into it. No
    # bytecode compilation either: it is most of the install time, and Python compiles what it imports.
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q",
                        "--no-compile", "-c", str(ROOT / "constraints.txt"), str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    progress("installed it and its dependencies into a fresh venv", t0)

    path = [p for p in os.environ["PATH"].split(os.pathsep) if not Path(p).resolve().is_relative_to(ROOT)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    cwd = base / "elsewhere"
    cwd.mkdir()
    return Installed(venv, cwd, env)


def test_the_packages_are_imported_from_the_venv_and_the_cli_starts(installed):
    files = installed.python_c("""
        import agentrl, hpc
        print(agentrl.__file__)
        print(hpc.__file__)
    """).split()
    for file in map(Path, files):
        assert file.is_relative_to(installed.venv) and not file.resolve().is_relative_to(ROOT), file
    r = installed.agentrl("--help")
    assert r.returncode == 0, r.stderr
    assert "cluster" in r.stdout and "tasks" in r.stdout


@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                    reason="needs bubblewrap and root (make sysdeps)")
def test_tasks_check_of_a_bundled_task_passes_the_oracle_and_fails_the_noop(installed):
    task = Path(installed.python_c("""
        from agentrl.swe.harbor import BUNDLED_TASKS
        print(BUNDLED_TASKS / "roman-subtractive")
    """).strip())
    assert task.is_relative_to(installed.venv) and (task / "task.toml").is_file(), task
    # The sandbox supervisor runs on the system Python with PYTHONPATH = the venv's site-packages.
    r = installed.agentrl("tasks", "check", task, "--json", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (row,) = json.loads(r.stdout.strip().splitlines()[-1])["tasks"]
    assert (row["instance_id"], row["oracle_reward"], row["noop_reward"], row["problem"]) == \
        ("roman-subtractive", 1.0, 0.0, "")


def test_the_viewer_renders_its_pages_from_the_packaged_templates(installed):
    run_dir = installed.cwd / "view-run"
    installed.python_c("""
        import sys
        from hpc.runlayout import RunLayout
        RunLayout.create(sys.argv[1], run_id="wheel-view")
    """, run_dir)
    r = installed.agentrl("view", run_dir, "--quiet")
    assert r.returncode == 0, r.stderr
    index = (run_dir / "view" / "index.html").read_text()
    assert "wheel-view" in index and (run_dir / "view" / "view.css").is_file()


def test_the_tiny_tokenizer_is_built_and_reloaded_with_the_packaged_chat_template(installed):
    # Tokenizer only: the weights need torch, which is in the train extra.
    out = installed.python_c("""
        import json, sys
        from pathlib import Path
        from transformers import AutoTokenizer
        from agentrl.models import tiny

        model = tiny.make_tiny_model(Path(sys.argv[1]), weights=False)
        tokenizer = AutoTokenizer.from_pretrained(str(model))
        tools = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                  "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
        chat = [{"role": "user", "content": "fix the failing test"}]
        print(json.dumps({
            "template_file": str(tiny.CHAT_TEMPLATE_PATH),
            "saved_template_is_packaged": tokenizer.chat_template == tiny.chat_template(),
            "reloaded": tokenizer.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=True),
            "rendered": tiny.render_chat(chat, tools=tools, add_generation_prompt=True),
        }))
    """, installed.cwd / "tiny-model", timeout=300)
    result = json.loads(out)
    assert Path(result["template_file"]).is_relative_to(installed.venv)
    assert result["saved_template_is_packaged"]
    assert result["reloaded"] == result["rendered"]
    assert result["rendered"].startswith("<|im_start|>system\n# Tools\n")
    assert result["rendered"].endswith("<|im_start|>user\nfix the failing test<|im_end|>\n<|im_start|>assistant\n")


def test_the_harnesses_read_their_pins_and_files_from_the_package(installed):
    # The CLIs themselves are an npm install of some 500 MB: the test checks that the installed package
    # knows what to install and owns the files it copies, not npm.
    tools = installed.cwd / "tools"
    out = installed.python_c("""
        import json, sys
        from pathlib import Path
        from agentrl.harness import get_harness
        from agentrl.harness.install import CHECKOUT_CLIS, PINNED_CLIS, pinned_cli_packages

        get_harness("builtin").install(Path(sys.argv[1]))
        print(json.dumps({"pins": PINNED_CLIS, "packages": pinned_cli_packages(),
                          "checkout_clis": CHECKOUT_CLIS.exists()}))
    """, tools)
    result = json.loads(out)
    assert result["pins"] == PINNED_CLIS
    assert result["packages"] == [f"{package}@{version}" for package, version in PINNED_CLIS.items()]
    assert not result["checkout_clis"]   # so an install from the wheel goes to npm, not to a checkout
    assert (tools / "builtin_agent.py").read_bytes() == (ROOT / "agentrl/harness/builtin_agent.py").read_bytes()


def test_the_cluster_command_finds_its_script(installed):
    # Only the read-only actions: other tests use the cluster that is up (or find it down).
    status = installed.agentrl("cluster", "status")
    assert status.returncode == 0, status.stderr
    assert "slurmctld: " in status.stdout
    env = installed.agentrl("cluster", "env")
    assert env.returncode == 0, env.stderr
    assert env.stdout.startswith("export SLURM_CONF=") and env.stdout.strip().endswith("/etc/slurm.conf")
