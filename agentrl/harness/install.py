"""Putting CLIs into the host tools directory that sandboxes mount read-only (task images stay untouched).

    TOOLS/clis/       Claude Code and Qwen Code at the pinned versions (tools/install_agent_clis.sh)
    TOOLS/node/bin/node   a Node.js for images without one (Qwen Code, CodeBuddy Code)
    TOOLS/codebuddy/  CodeBuddy Code (npm)
    TOOLS/builtin_agent.py

Everything is built beside its final place and renamed in, so a concurrent install or a killed one
never leaves a half-written tree where a sandbox would run it. Every step is idempotent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from .base import HarnessInstallError

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO_ROOT / "tools" / "install_agent_clis.sh"
REPO_CLIS = REPO_ROOT / ".agent-clis"      # what `make clis` installs
CLAUDE_BIN = "node_modules/.bin/claude"
QWEN_ENTRY = "node_modules/@qwen-code/qwen-code/cli-entry.js"
NODE_BIN_DIR = "node/bin"
NODE_BIN = f"{NODE_BIN_DIR}/node"
MIN_NODE_MAJOR = 20


def pinned_versions(script: Path = INSTALL_SCRIPT) -> dict[str, str]:
    """The versions tools/install_agent_clis.sh pins: the one place they are written down."""
    try:
        text = script.read_text()
    except OSError as e:
        raise HarnessInstallError(f"cannot read the pinned CLI versions: {e}") from None
    found = dict(re.findall(r"^(CLAUDE_CODE_VERSION|QWEN_CODE_VERSION)=(\S+)$", text, re.M))
    if len(found) != 2:
        raise HarnessInstallError(f"{script} no longer pins CLAUDE_CODE_VERSION and QWEN_CODE_VERSION")
    return found


def _output(argv: list[str], timeout: float = 60) -> str | None:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def clis_ready(clis: Path) -> bool:
    """Both CLIs answer with the pinned versions (asked, not read from package.json: a blocked
    postinstall leaves Claude Code's package.json beside a stub)."""
    versions = pinned_versions()
    return (_output([str(clis / CLAUDE_BIN), "--version"]) == f"{versions['CLAUDE_CODE_VERSION']} (Claude Code)"
            and _output(["node", str(clis / QWEN_ENTRY), "--version"]) == versions["QWEN_CODE_VERSION"])


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
    """TOOLS/clis at the pinned versions: a copy of the repository's `make clis` install when that one is
    right (reflinked where the filesystem can), else a fresh npm install through the pinning script."""
    dest = tools_dir / "clis"
    if clis_ready(dest):
        return dest

    def build(tmp: Path) -> None:
        if clis_ready(REPO_CLIS):
            r = subprocess.run(["cp", "-a", "--reflink=auto", f"{REPO_CLIS}/.", str(tmp)], capture_output=True,
                               text=True)
            if r.returncode == 0:
                return
        if not INSTALL_SCRIPT.exists():
            raise HarnessInstallError(f"{INSTALL_SCRIPT} is missing and {REPO_CLIS} holds no pinned install")
        r = subprocess.run(["bash", str(INSTALL_SCRIPT), str(tmp)], capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise HarnessInstallError(f"installing the agent CLIs into {dest} failed: "
                                      f"{(r.stderr or r.stdout).strip()[-2000:]}")
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


def install_npm_package(dest: Path, package: str, ready: Callable[[Path], bool]) -> None:
    """`npm install PACKAGE` into dest (its own prefix); the error names the package and npm's answer."""
    if ready(dest):
        return
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessInstallError(f"npm is missing: cannot install {package} into {dest} (install Node.js and npm)")

    def build(tmp: Path) -> None:
        r = subprocess.run([npm, "install", "--prefix", str(tmp), "--no-audit", "--no-fund", "--save-exact",
                            "--loglevel=error", package], capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise HarnessInstallError(f"npm could not install {package} into {dest}: "
                                      f"{(r.stderr or r.stdout).strip()[-2000:]}")
    place_atomically(dest, build, ready)


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
