"""A Python agent in the tools directory with a Python of its own (mini-swe-agent, OpenHands).

The task image's Python is neither used nor touched. Each such agent's tree:

    TOOLS/DIR/python/     a copy of a CPython (binary, stdlib, lib-dynload, and the shared libraries they need
                          that glibc does not provide), relocatable: it finds its stdlib from where the binary is
    TOOLS/DIR/site/       the agent and its requirements (pip --target --no-deps: the pinned closure, exactly)
    TOOLS/DIR/LAUNCHER    our launcher, run as `python3 -I -S LAUNCHER`; it adds site/ itself
    ...                   our other files (the agent's model classes)

No path inside is absolute, so the tree works wherever it is mounted (/opt/agentrl/tools in a sandbox).
`make clis` builds it in the checkout's .agent-clis/DIR; a tools directory gets a copy of that (reflinked
where the filesystem can), else a build of its own. Everything is built beside its place and renamed in.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .base import HarnessInstallError
from .install import CHECKOUT_CLIS, install_file, place_atomically

PYTHON = "python/bin/python3"
LIBS = "python/lib"
# Shared libraries of glibc itself: never copied (they must match the image's loader).
GLIBC = ("linux-vdso", "linux-gate", "ld-linux", "libc.so", "libm.so", "libmvec.so", "libpthread.so", "libdl.so",
         "librt.so", "libutil.so", "libresolv.so", "libnsl.so", "libanl.so", "libBrokenLocale.so")
# Stdlib parts an agent never runs.
STDLIB_SKIP = ("site-packages", "dist-packages", "test", "config-*", "idlelib", "tkinter", "turtledemo", "ensurepip",
               "_tkinter.*", "_test*.so", "xxlimited*.so")
# Asked of an interpreter: where its real binary, stdlib and extension modules are (a venv's base's).
WHERE = ("import json, os, sys, sysconfig; d = next((p for p in sys.path if p.endswith('lib-dynload')), None); "
         "print(json.dumps({'binary': os.path.realpath(getattr(sys, '_base_executable', None) or sys.executable), "
         "'stdlib': os.path.realpath(sysconfig.get_paths()['stdlib']), 'dynload': d and os.path.realpath(d), "
         "'version': list(sys.version_info[:2])}))")


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def launch_env(root: Path | str) -> dict[str, str]:
    """The bundled libraries' directory for the loader (the launcher takes it back out of the environment)."""
    return {"LD_LIBRARY_PATH": f"{root}/{LIBS}"}


def interpreter_facts(python: Path) -> dict:
    try:
        r = _run([str(python), "-I", "-c", WHERE], timeout=60)
        facts = json.loads(r.stdout) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        facts = None
    if not isinstance(facts, dict) or facts.get("dynload") is None:
        raise HarnessInstallError(f"cannot find the binary, stdlib and lib-dynload of {python} to copy")
    return facts


def find_python(minimum: tuple[int, int], what: str) -> Path:
    """A CPython of at least `minimum` on this host: python3.X on PATH (the lowest such X first: the pins were
    resolved on it), then pyenv's versions. Refuses naming what needs it and how to get one."""
    candidates = [found for minor in range(minimum[1], minimum[1] + 4)
                  if (found := shutil.which(f"python{minimum[0]}.{minor}"))]
    pyenv = Path.home() / ".pyenv" / "versions"
    candidates += [str(p) for p in sorted(pyenv.glob(f"{minimum[0]}.*/bin/python3"),
                                          key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parts[-3].split(".")])]
    for candidate in candidates:
        try:
            version = interpreter_facts(Path(candidate))["version"]
        except HarnessInstallError:
            continue
        if tuple(version) >= minimum:
            return Path(candidate)
    raise HarnessInstallError(f"{what} needs Python {minimum[0]}.{minimum[1]} or newer, and none was found (looked "
                              f"for python{minimum[0]}.{minimum[1]}+ on PATH and in {pyenv}): install one, e.g. "
                              f"`pyenv install {minimum[0]}.{minimum[1]}` or Debian's python{minimum[0]}.{minimum[1]}")


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


def portable_python(dest: Path, python: Path) -> None:
    """Copy the CPython that `python` runs (a venv's base interpreter) to dest: bin/python3, its stdlib under
    lib/pythonX.Y (lib-dynload included), and the shared libraries beyond glibc in lib/."""
    facts = interpreter_facts(python)
    binary, stdlib, dynload = Path(facts["binary"]), Path(facts["stdlib"]), Path(facts["dynload"])
    version = "python{}.{}".format(*facts["version"])
    if not binary.is_file() or not (stdlib / "os.py").is_file() or not dynload.is_dir():
        raise HarnessInstallError(f"cannot find {python}'s binary, stdlib and lib-dynload to copy "
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


@dataclass(frozen=True)
class PythonTool:
    """One Python agent's tree in the tools directory, and how to build, check and place it."""

    dir: str                                   # under the tools directory (and the checkout's .agent-clis)
    package: str                               # the agent's distribution, as pip and `--version` name it
    version: str
    pins: tuple[str, ...]                      # the closure, the agent included, as `name==version`
    own_files: tuple[tuple[Path, str], ...]    # (our source, its path under the tree); the launcher first
    interpreter: Callable[[], Path]            # the Python to copy and to run pip with

    @property
    def launcher(self) -> str:
        return self.own_files[0][1]

    @property
    def checkout(self) -> Path:
        return CHECKOUT_CLIS / self.dir       # what `make clis` builds in a source checkout

    def argv(self, root: str) -> list[str]:
        """The launcher's command line, the tree mounted at root: no PYTHON* variables, no site directories."""
        return [f"{root}/{PYTHON}", "-I", "-S", f"{root}/{self.launcher}"]

    def ready(self, root: Path) -> bool:
        """The bundled Python runs the launcher, and the agent imports, at the pinned version; our own files
        are this checkout's."""
        if not all((root / name).is_file() and (root / name).read_bytes() == source.read_bytes()
                   for source, name in self.own_files):
            return False
        try:
            with tempfile.TemporaryDirectory() as scratch:   # an agent may create its config dir at import
                r = _run([*self.argv(str(root)), "--version"], env={"HOME": scratch, **launch_env(root)})
        except (OSError, subprocess.TimeoutExpired):
            return False
        return r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == [f"{self.package} {self.version}"]

    def pip_install(self, site: Path, dest: Path) -> None:
        """The pinned closure into `site`, each exactly (--no-deps), with the copied interpreter's own pip."""
        what = f"{self.package}=={self.version}"
        with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix=f"{self.dir}-pins.") as pins:
            pins.write("\n".join(self.pins) + "\n")
            pins.flush()
            argv = [str(self.interpreter()), "-m", "pip", "install", "--target", str(site), "--no-input", "--no-deps",
                    "--disable-pip-version-check", "--no-warn-script-location", "--quiet", "-r", pins.name]
            try:
                r = _run(argv, timeout=1800)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise HarnessInstallError(f"pip could not install {what} into {dest}: {e}") from None
        if r.returncode != 0:
            errors = "\n".join(line for line in (r.stderr or r.stdout).splitlines()
                               if not line.startswith("WARNING: Location"))
            raise HarnessInstallError(f"pip could not install {what} into {dest} (it needs PyPI or a pip "
                                      f"index): {errors.strip()[-2000:]}")
        shutil.rmtree(site / "bin", ignore_errors=True)   # console scripts whose #! names the host's Python

    def install_own_files(self, root: Path) -> None:
        for source, name in self.own_files:
            install_file(source, root / name)

    def build(self, tmp: Path, dest: Path) -> None:
        portable_python(tmp / "python", self.interpreter())
        self.pip_install(tmp / "site", dest)
        self.install_own_files(tmp)

    def refresh(self, root: Path) -> bool:
        """A built tree whose own files are an older checkout's gets this one's (each renamed in); then whether
        it is ready. Cheaper than building again for a change of our own files."""
        if (root / PYTHON).is_file() and (root / "site").is_dir():
            self.install_own_files(root)
        return self.ready(root)

    def install(self, tools_dir: Path) -> Path:
        """TOOLS/DIR: a copy of the checkout's `make clis` build when that one works, else a fresh build.
        Idempotent."""
        dest = tools_dir / self.dir

        def make(tmp: Path) -> None:
            if tmp.parent.resolve() != self.checkout.parent.resolve() and self.refresh(self.checkout):
                r = _run(["cp", "-a", "--reflink=auto", f"{self.checkout}/.", str(tmp)], timeout=1800)
                if r.returncode == 0:
                    return
                for child in tmp.iterdir():
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
            self.build(tmp, dest)
        if not self.refresh(dest):
            place_atomically(dest, make, self.ready)
        return dest


def running_python() -> Path:
    """The Python running agentrl (a venv's: its base is what gets copied)."""
    return Path(sys.executable)
