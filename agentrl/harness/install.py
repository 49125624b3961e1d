"""Putting CLIs into the host tools directory that sandboxes mount read-only (task images stay untouched).

    TOOLS/clis/       Claude Code, Qwen Code, Codex, OpenCode and Gemini CLI at the pinned versions (PINNED_CLIS)
    TOOLS/node/bin/node   a Node.js for images without one (Qwen Code, Gemini CLI, CodeBuddy Code)
    TOOLS/codebuddy/  CodeBuddy Code (npm)
    TOOLS/mini-swe-agent/   mini-swe-agent with a Python of its own (python_tool.py builds it)
    TOOLS/openhands/  OpenHands' SDK with a Python 3.12 of its own (likewise)
    TOOLS/builtin_agent.py

Everything is built beside its final place and renamed in, so a concurrent install or a killed one
never leaves a half-written tree where a sandbox would run it. Every step is idempotent.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from .base import HarnessInstallError

# The agent CLIs the harnesses drive, pinned here and nowhere else: install_clis and `make clis`
# (tools/install_agent_clis.sh runs main() below) install exactly these. docs/agent-clis.md records what
# these versions send; re-check it when a pin moves.
CLAUDE_CODE = "@anthropic-ai/claude-code"
QWEN_CODE = "@qwen-code/qwen-code"
CODEX = "@openai/codex"
OPENCODE = "opencode-ai"
GEMINI_CLI = "@google/gemini-cli"
PINNED_CLIS = {CLAUDE_CODE: "2.1.332", QWEN_CODE: "0.24.4", CODEX: "0.171.0",     # npm package -> version
               OPENCODE: "1.18.33", GEMINI_CLI: "0.61.0"}

# `make clis` installs the pinned CLIs into .agent-clis/ of a source checkout, and install_clis copies that
# tree rather than asking npm again. An installed wheel has no checkout beside its packages: there this
# path does not exist, and install_clis runs npm.
CHECKOUT_CLIS = Path(__file__).resolve().parents[2] / ".agent-clis"
CLAUDE_BIN = "node_modules/.bin/claude"
QWEN_BIN = "node_modules/.bin/qwen"
QWEN_ENTRY = "node_modules/@qwen-code/qwen-code/cli-entry.js"
GEMINI_ENTRY = "node_modules/@google/gemini-cli/bundle/gemini.js"
# Codex's npm package is a Node launcher; the program is a static musl binary in a platform package
# (an optionalDependency aliased to `@openai/codex@VERSION-linux-x64`, from the npm registry like the
# rest). The harness runs the binary itself, so images need no Node for it.
CODEX_TARGETS = {"x86_64": ("linux-x64", "x86_64-unknown-linux-musl"),
                 "aarch64": ("linux-arm64", "aarch64-unknown-linux-musl")}


def codex_bin(machine: str) -> str:
    """The Codex binary under the npm prefix, for a host of this `platform.machine()`."""
    if machine not in CODEX_TARGETS:
        return "node_modules/.bin/codex"   # the Node launcher, which names the platform it lacks
    package, target = CODEX_TARGETS[machine]
    return f"node_modules/@openai/codex-{package}/vendor/{target}/bin/codex"


CODEX_BIN = codex_bin(platform.machine())
# OpenCode likewise: its launcher runs a Bun-compiled binary from the platform package npm picked
# (`opencode-linux-x64`, beside a `-baseline` build for CPUs without AVX2, which npm installs too).
OPENCODE_PACKAGES = {"x86_64": "opencode-linux-x64", "aarch64": "opencode-linux-arm64"}


def opencode_bin(machine: str) -> str:
    """The OpenCode binary under the npm prefix, for a host of this `platform.machine()`."""
    if machine not in OPENCODE_PACKAGES:
        return "node_modules/.bin/opencode"     # the launcher, which names the platform it lacks
    return f"node_modules/{OPENCODE_PACKAGES[machine]}/bin/opencode"

# `make clis` also builds mini-swe-agent (agentrl/harness/mini_swe_agent.py) in this folder of the checkout's
# .agent-clis, and the harness puts it into TOOLS/mini-swe-agent.
MINI_DIR = "mini-swe-agent"
OPENHANDS_DIR = "openhands"
PYTHON_TOOL_DIRS = (MINI_DIR, OPENHANDS_DIR)
NODE_BIN_DIR = "node/bin"
NODE_BIN = f"{NODE_BIN_DIR}/node"
MIN_NODE_MAJOR = 20


def _output(argv: list[str], timeout: float = 60) -> str | None:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def clis_ready(clis: Path) -> bool:
    """Every CLI answers with its pinned version (asked, not read from package.json: a blocked
    postinstall leaves Claude Code's package.json beside a stub, a skipped optional dependency
    leaves Codex's launcher without its binary)."""
    return (_output([str(clis / CLAUDE_BIN), "--version"]) == f"{PINNED_CLIS[CLAUDE_CODE]} (Claude Code)"
            and _output(["node", str(clis / QWEN_ENTRY), "--version"]) == PINNED_CLIS[QWEN_CODE]
            and _output([str(clis / CODEX_BIN), "--version"]) == f"codex-cli {PINNED_CLIS[CODEX]}"
            and _output([str(clis / opencode_bin(platform.machine())), "--version"]) == PINNED_CLIS[OPENCODE]
            and _output(["node", str(clis / GEMINI_ENTRY), "--version"]) == PINNED_CLIS[GEMINI_CLI])


def pinned_cli_packages() -> list[str]:
    """The npm install arguments of the pinned CLIs: `package@version`."""
    return [f"{package}@{version}" for package, version in PINNED_CLIS.items()]


def place_atomically(dest: Path, build: Callable[[Path], None], ready: Callable[[Path], bool]) -> None:
    """Build into a fresh directory next to `dest`, check it, then rename it into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        os.chmod(tmp, 0o755)   # mkdtemp's 0700 would lock the sandbox's agent user (uid 1000) out
        build(tmp)
        if not ready(tmp):
            raise HarnessInstallError(f"{dest}: the freshly built tree does not work")
        if dest.exists() or dest.is_symlink():
            if ready(dest):          # someone else finished first
                return
            old = dest.with_name(f".{dest.name}.old.{os.getpid()}")
            dest.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            tmp.rename(dest)
        except OSError:
            if not ready(dest):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def install_clis(tools_dir: Path) -> Path:
    """TOOLS/clis at the pinned versions: a copy of the checkout's `make clis` install when that one is
    right (reflinked where the filesystem can), else a fresh npm install."""
    dest = tools_dir / "clis"
    if clis_ready(dest):
        return dest

    def build(tmp: Path) -> None:
        if clis_ready(CHECKOUT_CLIS):
            # The npm tree only: the Python agents' builds beside it have places of their own in the tools dir
            # (and a dot-folder is someone's build in progress).
            parts = [str(p) for p in CHECKOUT_CLIS.iterdir()
                     if p.name not in PYTHON_TOOL_DIRS and not p.name.startswith(".")]
            r = subprocess.run(["cp", "-a", "--reflink=auto", *parts, str(tmp)], capture_output=True, text=True)
            if r.returncode == 0:
                return
        npm_install(tmp, pinned_cli_packages(), dest)
    place_atomically(dest, build, clis_ready)
    return dest


def host_node() -> Path:
    found = shutil.which("node")
    if found is None:
        raise HarnessInstallError("no `node` on PATH to copy into the tools directory (install Node.js 20 or newer)")
    return Path(found).resolve()


def node_ready(node: Path) -> bool:
    version = _output([str(node), "--version"])
    return bool(version and re.fullmatch(r"v(\d+)\..*", version)
                and int(version[1:].split(".")[0]) >= MIN_NODE_MAJOR)


def missing_libraries(binary: Path) -> list[str]:
    ldd = shutil.which("ldd") or "/usr/bin/ldd"
    try:
        r = subprocess.run([ldd, str(binary)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []   # no ldd to ask: the version check that follows still runs the copy
    return [line.split()[0] for line in r.stdout.splitlines() if "not found" in line]


def install_node(tools_dir: Path) -> Path:
    """TOOLS/node/bin/node: the host's Node.js binary, for images that have none.

    Only the binary is copied. Node.js builds link glibc, libstdc++ and libgcc_s (checked with ldd),
    which every glibc image carries; the host's own libstdc++ would raise the glibc floor from node's
    2.28 to the host's, so the image's libraries are the better bet. musl images cannot run it.
    """
    dest = tools_dir / "node"
    if node_ready(dest / "bin/node"):
        return dest / "bin/node"
    source = host_node()
    if missing := missing_libraries(source):
        raise HarnessInstallError(f"{source} cannot run here: missing shared libraries {', '.join(missing)}")

    def build(tmp: Path) -> None:
        (tmp / "bin").mkdir()
        shutil.copy2(source, tmp / "bin/node")
    place_atomically(dest, build, lambda d: node_ready(d / "bin/node"))
    return dest / "bin/node"


def npm_install(prefix: Path, packages: Sequence[str], dest: Path) -> None:
    """`npm install PACKAGES` into prefix, the build directory of dest; errors name dest and npm's answer."""
    what = " ".join(packages)
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessInstallError(f"npm is missing: cannot install {what} into {dest} (install Node.js and npm)")
    r = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--save-exact",
                        "--loglevel=error", *packages], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise HarnessInstallError(f"npm could not install {what} into {dest}: "
                                  f"{(r.stderr or r.stdout).strip()[-2000:]}")


def install_npm_package(dest: Path, package: str, ready: Callable[[Path], bool]) -> None:
    """`npm install PACKAGE` into dest (its own prefix), unless dest is ready already."""
    if ready(dest):
        return
    place_atomically(dest, lambda tmp: npm_install(tmp, [package], dest), ready)


def install_file(source: Path, dest: Path) -> None:
    """Copy one file into place atomically (a same-directory temp file, then rename)."""
    if dest.exists() and dest.read_bytes() == source.read_bytes():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(source.read_bytes())
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

