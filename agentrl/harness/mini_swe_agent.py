"""mini-swe-agent (OpenAI chat API), its `mini` command run unattended (docs/harnesses.md).

Two harnesses, one per output format of mini-swe-agent 2: `mini_swe_agent` (its default mini.yaml:
one `bash` tool, tool calls) and `mini_swe_agent_text` (mini_textbased.yaml: one ```mswea_bash_command
block per reply, parsed by regex). The episode ends when a command prints
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT first; a reply without exactly one action is a format error:
mini drops that reply from its history and sends its "Format error" message instead (docs/agent-clis.md).

It is a Python program, installed with its own Python in the tools directory so that the task image's
Python is neither used nor touched:

    TOOLS/mini-swe-agent/python/     a copy of the Python that runs agentrl (binary, stdlib, lib-dynload,
                                     and the shared libraries they need that glibc does not provide),
                                     relocatable: it finds its stdlib from where the binary is
    TOOLS/mini-swe-agent/site/       mini-swe-agent and its requirements (pip --target), pinned
    TOOLS/mini-swe-agent/agentrl_mini.py   the launcher (mini_swe_agent_run.py)
    TOOLS/mini-swe-agent/site/agentrl_mini_model.py   its model classes pointed at the adapter, not litellm
                                     (mini_swe_agent_model.py)

No path inside is absolute, so the tree works wherever it is mounted (/opt/agentrl/tools in a sandbox).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any, Literal

from .base import (
    AgentCommand,
    HarnessInstallError,
    HarnessRun,
    Trajectory,
    WireProtocol,
    argv_size_warnings,
    compaction_warnings,
    read_summary_line,
    with_overrides,
)
from .install import CHECKOUT_CLIS, MINI_DIR, install_file, place_atomically
from .prompts import prompt_and_files

PACKAGE = "mini-swe-agent"
VERSION = "2.4.6"
DIR = MINI_DIR                             # under the tools directory
CHECKOUT_MINI = CHECKOUT_CLIS / DIR        # what `make clis` builds in a source checkout
LAUNCHER_SOURCE = Path(__file__).with_name("mini_swe_agent_run.py")
LAUNCHER = "agentrl_mini.py"
MODEL_SOURCE = Path(__file__).with_name("mini_swe_agent_model.py")
MODEL = "site/agentrl_mini_model.py"
PYTHON = "python/bin/python3"
LIBS = "python/lib"
# mini-swe-agent 2.4.6's requirements, less those its `mini` command never imports with our model classes:
# litellm and openai (its default model layer; 230 MB, and 2.6 s of CPU to import at every start), datasets
# (SWE-bench batch runs; 330 MB with pyarrow and pandas) and textual (the trajectory inspector).
REQUIREMENTS = ("pyyaml", "requests", "jinja2", "pydantic>=2.0", "tenacity", "rich", "python-dotenv", "typer",
                "platformdirs", "prompt_toolkit")
# Their closure as pip resolved it on 2026-12-05 (CPython 3.11): the constraints every install uses.
PINS = """
annotated-doc==0.0.7 annotated-types==0.8.0 certifi==2026.10.19.post1 charset-normalizer==3.5.3 idna==3.20
Jinja2==3.1.6 markdown-it-py==4.3.0 MarkupSafe==3.0.4 mdurl==0.1.2 platformdirs==4.14.9 prompt_toolkit==3.0.53
pydantic==2.14.4 pydantic_core==2.50.5 Pygments==2.21.0 python-dotenv==1.2.4 PyYAML==6.0.4 requests==2.34.2
rich==15.0.0 shellingham==1.5.4 tenacity==9.2.1 typer==0.29.2 typing_extensions==4.16.0 typing-inspection==0.4.5
urllib3==2.8.0 wcwidth==0.9.4
""".split()
# Shared libraries of glibc itself: never copied (they must match the image's loader).
GLIBC = ("linux-vdso", "linux-gate", "ld-linux", "libc.so", "libm.so", "libmvec.so", "libpthread.so", "libdl.so",
         "librt.so", "libutil.so", "libresolv.so", "libnsl.so", "libanl.so", "libBrokenLocale.so")
# Stdlib parts the agent never runs.
STDLIB_SKIP = ("site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip",
               "_tkinter.*", "_test*.so", "xxlimited*.so")
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# The read timeout of a model call (mini's own is 60 s, and mini retries a timed-out call: the same turn
# generated again). The sandbox's time limit is the real bound.
REQUEST_TIMEOUT_S = 3600

Format = Literal["toolcall", "text"]
CONFIGS: dict[str, tuple[str, str]] = {   # format -> (mini's builtin config, the model class)
    "toolcall": ("mini.yaml", "agentrl_mini_model.AdapterModel"),
    "text": ("mini_textbased.yaml", "agentrl_mini_model.AdapterTextbasedModel"),
}


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def launch_env(root: Path | str) -> dict[str, str]:
    return {"LD_LIBRARY_PATH": f"{root}/{LIBS}"}


def mini_ready(root: Path) -> bool:
    """The bundled Python runs the launcher, and mini-swe-agent and the model classes import, at the pinned
    version; the launcher and the model classes are this checkout's."""
    if not all((root / name).is_file() and (root / name).read_bytes() == source.read_bytes()
               for source, name in ((LAUNCHER_SOURCE, LAUNCHER), (MODEL_SOURCE, MODEL))):
        return False
    try:
        with tempfile.TemporaryDirectory() as scratch:   # importing minisweagent creates its config dir
            r = _run([str(root / PYTHON), "-I", "-S", str(root / LAUNCHER), "--version"],
                     env={"HOME": scratch, "MSWEA_GLOBAL_CONFIG_DIR": scratch, **launch_env(root)})
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == [f"mini-swe-agent {VERSION}"]


def needed_libraries(binaries: list[Path]) -> dict[str, Path]:
    """soname -> path of every shared library the binaries load that glibc does not provide (by ldd)."""
    ldd = shutil.which("ldd") or "/usr/bin/ldd"
    out: dict[str, Path] = {}
    for binary in binaries:
        try:
            r = _run([ldd, str(binary)], timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise HarnessInstallError(f"cannot list the shared libraries of {binary} with ldd: {e}") from None
        for line in r.stdout.splitlines():
            name, _, rest = line.strip().partition(" => ")
            if "not found" in rest:
                raise HarnessInstallError(f"{binary} needs {name}, which is not installed")
            path = rest.split(" (")[0].strip()
            if path.startswith("/") and not name.startswith(GLIBC):
                out[name] = Path(path)
    return out


def portable_python(dest: Path) -> None:
    """Copy the Python running this code (the base interpreter of a venv) to dest: bin/python3, its stdlib
    under lib/pythonX.Y (lib-dynload included), and the shared libraries beyond glibc in lib/."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    binary = Path(getattr(sys, "_base_executable", None) or sys.executable).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    dynload = next((Path(p).resolve() for p in sys.path if p.endswith("lib-dynload")), None)
    if not binary.is_file() or not (stdlib / "os.py").is_file() or dynload is None:
        raise HarnessInstallError(f"cannot find this Python's binary, stdlib and lib-dynload to copy "
                                  f"({binary}, {stdlib}, {dynload})")
    (dest / "bin").mkdir(parents=True)
    shutil.copy2(binary, dest / "bin/python3")
    lib = dest / "lib"
    shutil.copytree(stdlib, lib / version, symlinks=False, ignore_dangling_symlinks=True,
                    ignore=shutil.ignore_patterns(*STDLIB_SKIP))
    if not (lib / version / "lib-dynload").is_dir():
        shutil.copytree(dynload, lib / version / "lib-dynload")
    modules = sorted((lib / version / "lib-dynload").glob("*.so"))
    for name, path in needed_libraries([binary, *modules]).items():
        shutil.copy2(path, lib / name)


def pip_install(site: Path, dest: Path) -> None:
    """mini-swe-agent and its requirements into `site`, pinned, with this Python's pip (same version as the copy)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="mini-swe-agent-pins.") as pins:
        pins.write("\n".join(PINS) + "\n")
        pins.flush()
        base = [sys.executable, "-m", "pip", "install", "--target", str(site), "--no-input",
                "--disable-pip-version-check", "--no-warn-script-location", "--quiet", "-c", pins.name]
        for args in ([*REQUIREMENTS], ["--no-deps", f"{PACKAGE}=={VERSION}"]):
            try:
                r = subprocess.run([*base, *args], capture_output=True, text=True, timeout=1800)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise HarnessInstallError(f"pip could not install {PACKAGE}=={VERSION} into {dest}: {e}") from None
            if r.returncode != 0:
                errors = "\n".join(line for line in (r.stderr or r.stdout).splitlines()
                                   if not line.startswith("WARNING: Location"))
                raise HarnessInstallError(f"pip could not install {PACKAGE}=={VERSION} into {dest} (it needs "
                                          f"PyPI or a pip index): {errors.strip()[-2000:]}")
    shutil.rmtree(site / "bin", ignore_errors=True)   # console scripts whose #! names the host's Python


def build(tmp: Path, dest: Path) -> None:
    portable_python(tmp / "python")
    pip_install(tmp / "site", dest)
    install_own_files(tmp)


def install_own_files(root: Path) -> None:
    install_file(LAUNCHER_SOURCE, root / LAUNCHER)
    install_file(MODEL_SOURCE, root / MODEL)


def refresh_mini(root: Path) -> bool:
    """A built install whose launcher or model classes are an older checkout's gets this one's (each file
    renamed in); then whether it is ready. Cheaper than building again for a change of our own files."""
    if (root / PYTHON).is_file() and (root / "site").is_dir():
        install_own_files(root)
    return mini_ready(root)


def install_mini(tools_dir: Path) -> Path:
    """TOOLS/mini-swe-agent: a copy of the checkout's `make clis` build when that one works (reflinked where
    the filesystem can), else a fresh one. Idempotent; built beside its place and renamed in."""
    dest = tools_dir / DIR
    if refresh_mini(dest):
        return dest

    def make(tmp: Path) -> None:
        if tmp.parent.resolve() != CHECKOUT_MINI.parent.resolve() and refresh_mini(CHECKOUT_MINI):
            r = _run(["cp", "-a", "--reflink=auto", f"{CHECKOUT_MINI}/.", str(tmp)], timeout=1800)
            if r.returncode == 0:
                return
            for child in tmp.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        build(tmp, dest)
    place_atomically(dest, make, mini_ready)
    return dest


def config(run: HarnessRun, fmt: Format) -> dict[str, Any]:
    """The config layered over mini's own (`-c BUILTIN -c THIS`): unattended, no cost accounting, the adapter."""
    return {
        "agent": {
            "mode": "yolo",              # run every command without asking
            "confirm_exit": False,       # and end at the submission instead of asking for a new task
            "cost_limit": 0,             # no price for our model: 0 is no limit
        },
        "model": {
            "model_class": CONFIGS[fmt][1],
            "model_name": run.model,
            # Our model has no price: by default the first call's missing cost stops the run.
            "cost_tracking": "ignore_errors",
            "api_url": f"{run.base_url}/v1/chat/completions",
            "request_timeout": REQUEST_TIMEOUT_S,
            "model_kwargs": {"max_tokens": run.max_new_tokens},   # sent in the request's body
        },
        "environment": {"environment_class": "local"},   # commands run here, inside the sandbox
    }


class MiniSweAgent:
    protocol: WireProtocol = "openai"

    def __init__(self, fmt: Format = "toolcall") -> None:
        if fmt not in CONFIGS:
            raise ValueError(f"mini-swe-agent's format is 'toolcall' or 'text', got {fmt!r}")
        self.format: Format = fmt
        self.name = "mini_swe_agent" if fmt == "toolcall" else "mini_swe_agent_text"

    def install(self, tools_dir: Path) -> None:
        install_mini(tools_dir)

    def command(self, run: HarnessRun) -> AgentCommand:
        prompt, files = prompt_and_files(run)
        config_dir = f"{run.home}/.config/mini-swe-agent"     # platformdirs' user config dir for HOME
        ours = f"{config_dir}/agentrl.yaml"
        files[ours] = json.dumps(config(run, self.format), indent=1).encode()   # JSON is YAML
        root = f"{run.tools_dir}/{DIR}"
        argv = [f"{root}/{PYTHON}", "-I", "-S", f"{root}/{LAUNCHER}", "-c", CONFIGS[self.format][0], "-c", ours]
        env = {
            "HOME": run.home,
            **launch_env(root),              # the bundled libraries; the launcher takes them out again
            "OPENAI_API_KEY": run.api_key,   # the model class sends it as Authorization: Bearer
            "MSWEA_CONFIGURED": "1",         # else the first run asks for a default model and key on stdin
            "MSWEA_SILENT_STARTUP": "1",     # no banner
        }
        argv, env = with_overrides(argv, env, run)
        argv += ["--", prompt]
        warnings = compaction_warnings(run, None, "mini-swe-agent") + argv_size_warnings(prompt)
        return AgentCommand(argv=argv, env=env, files=files, warnings=warnings)

    def read_trajectory(self, stdout: bytes, stderr: bytes) -> Trajectory:
        return read_summary_line(stdout)
