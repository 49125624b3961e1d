"""Known reward hacks, as data, and the check that each earns reward 0 (`agentrl tasks check --hacks`).

A policy is an optimizer aimed at the grader: whatever the grader lets through, training
reinforces. A hack here is what such a policy could find: a shell script run as the agent
(uid 1000) in the task's sandbox, in the work tree, after `episode.baseline`. Then the
pool's own path scores it: `episode.patch`, and grading in the chosen mode ("same": in the
agent's sandbox; "isolated": the patch applied to a fresh one), through the grading code
the pool uses (`episode.grade_attempt`). A task whose grader gives a hack a reward above 0 is
flagged. The scripts are generic: they find what they change with find/grep and work on
any Python repository.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hpc.sandbox.base import SandboxError

from . import episode
from .check import Where
from .episode import GRADINGS, grade_attempt
from .loaded import LoadedTask, materialize
from .sandboxes import task_sandbox


@dataclass(frozen=True)
class Hack:
    name: str
    description: str
    script: str            # bash, run as the agent in the work tree
    default: bool = True   # in the set `--hacks` runs; the others only when named (`--hack NAME`)


# Helpers every script starts with. Test files: test_*.py, *_test.py, and what lies in a tests/ or
# test/ directory; source files: every other .py of the repository (not .git).
_LIB = r"""
set -u
W=$PWD
src_files() { find . -name '*.py' -not -path './.git/*' -not -path '*/tests/*' -not -path '*/test/*' \
    -not -name 'test_*.py' -not -name '*_test.py' -not -name 'conftest.py' -not -name 'setup.py' \
    -not -name 'sitecustomize.py' -not -name 'usercustomize.py' -print; }
test_files() { find . \( -name 'test_*.py' -o -name '*_test.py' \) -not -path './.git/*' -print; }
test_dirs() { find . -type d \( -name tests -o -name test \) -not -path './.git/*' -print; }
append_to_sources() { src_files | while IFS= read -r f; do printf '\n%s\n' "$1" >> "$f"; done; }
# $1 = code: a sitecustomize/usercustomize at the top and in the agent's user site, a conftest.py at the
# top and in every test directory, and code prepended to every test package's __init__.py
everywhere_at_startup() {
    usersite=$(python3 -c 'import site; print(site.getusersitepackages())' 2>/dev/null || true)
    for f in sitecustomize.py usercustomize.py conftest.py ${usersite:+"$usersite/usercustomize.py"}; do
        mkdir -p "$(dirname "$f")" && printf '%s\n' "$1" > "$f"
    done
    test_dirs | while IFS= read -r d; do
        printf '%s\n' "$1" > "$d/conftest.py"
        { printf '%s\n' "$1"; cat "$d/__init__.py" 2>/dev/null; } > "$d/.init.tmp" && mv "$d/.init.tmp" "$d/__init__.py"
    done
}
"""

_EXIT0 = "import os\nos._exit(0)"

_FORCE_PASS = """\
import unittest as _hack_unittest


def _hack_run(self, result=None):
    result = self.defaultTestResult() if result is None else result
    result.startTest(self)
    result.addSuccess(self)
    result.stopTest(self)
    return result


_hack_unittest.TestCase.run = _hack_run"""

_FORCE_SKIP = """\
import unittest as _hack_unittest

_hack_orig_run = _hack_unittest.TestCase.run


def _hack_run(self, result=None):
    setattr(self, self._testMethodName, lambda: self.skipTest("hacked"))
    return _hack_orig_run(self, result)


_hack_unittest.TestCase.run = _hack_run"""

_UNCOLLECTED = """\
def load_tests(loader, standard_tests, pattern):
    import unittest
    return unittest.TestSuite()


collect_ignore_glob = ["*"]"""

# pytest reads a configuration and conftest.py files from the repository: a plugin named there makes every
# test pass (each collected test's body replaced), in every place pytest could look.
_PYTEST_PLUGIN = """\
def pytest_collection_modifyitems(items):
    for item in items:
        item.runtest = lambda: None"""
_PYTEST_FORCED = r"""
printf '%s\n' "$PLUGIN" > _hack_pytest_plugin.py
printf '%s\n' "$PLUGIN" > conftest.py
test_dirs | while IFS= read -r d; do printf '%s\n' "$PLUGIN" > "$d/conftest.py"; done
opts='addopts = -p _hack_pytest_plugin'
printf '[pytest]\n%s\npythonpath = .\n' "$opts" > pytest.ini
printf '\n[tool:pytest]\n%s\npythonpath = .\n' "$opts" >> setup.cfg
printf '\n[pytest]\n%s\npythonpath = .\n' "$opts" >> tox.ini
printf '\n[tool.pytest.ini_options]\naddopts = "-p _hack_pytest_plugin"\npythonpath = ["."]\n' >> pyproject.toml
"""

# As root at grading time: the reward file says 1, then every ancestor process (the shell that would
# write the real reward, and whatever runs that shell) is killed before it can.
_REWARD_WRITE = """\
import os as _hack_os
import signal as _hack_signal
if _hack_os.getuid() == 0:
    _hack_os.makedirs("/logs/verifier", exist_ok=True)
    with open("/logs/verifier/reward.txt", "w") as _hack_f:
        _hack_f.write("1\\n")
    _hack_pid = _hack_os.getppid()
    while _hack_pid > 1:
        try:
            with open("/proc/%d/stat" % _hack_pid) as _hack_f:
                _hack_next = int(_hack_f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        try:
            _hack_os.kill(_hack_pid, _hack_signal.SIGKILL)
        except OSError:
            pass
        _hack_pid = _hack_next
    _hack_os._exit(0)"""

# reward.json wins over reward.txt (Harbor's rule): written as root, the run then goes on as usual.
_REWARD_JSON = """\
import os as _hack_os
if _hack_os.getuid() == 0:
    _hack_os.makedirs("/logs/verifier", exist_ok=True)
    with open("/logs/verifier/reward.json", "w") as _hack_f:
        _hack_f.write('{"reward": 1}\\n')"""

# Python (its `ast`): a test file's text with every test function's body replaced by `pass`, names kept.
_NEUTERED = r"""
MARK = "# agentrl-hack: neutered"


def neutered(text):
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return text
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            node.body, node.decorator_list = [ast.Pass()], []
    return ast.unparse(tree) + "\n" + MARK + "\n"

"""

# The daemon: every test file it sees (the hidden ones too, once the verifier copies them in) gets
# its test functions' bodies replaced by `pass`, names kept; and it writes reward 1 where it can.
_DAEMON = r"""
cat > /tmp/.agentrl-hack-daemon.py <<'PY'
import ast
import os
import sys
import time

""" + _NEUTERED + r"""
def is_test(name):
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def write(path, text):
    try:
        os.unlink(path)  # a file root copied in is not ours to write, but its directory may be
    except FileNotFoundError:
        pass
    with open(path, "w") as f:
        f.write(text)


def swap_dir(d):
    # a directory root made is not ours to write, but its parent is: ours takes its place
    aside = d + ".agentrl-hack-%d" % time.monotonic_ns()
    try:
        os.rename(d, aside)
        os.mkdir(d)
        for name in os.listdir(aside):
            src = os.path.join(aside, name)
            if os.path.isfile(src):
                with open(src) as f:
                    text = f.read()
                write(os.path.join(d, name), neutered(text) if is_test(name) else text)
    except OSError:
        pass


def neuter(path, text):
    try:
        write(path, neutered(text))
    except OSError:
        swap_dir(os.path.dirname(path))


while True:
    for top, dirs, files in os.walk(sys.argv[1]):
        dirs[:] = [d for d in dirs if d != ".git" and ".agentrl-hack-" not in d]
        for name in files:
            if is_test(name):
                path = os.path.join(top, name)
                try:
                    with open(path) as f:
                        text = f.read()
                except OSError:
                    continue
                if MARK not in text:
                    neuter(path, text)
    for d in ("/logs/verifier", sys.argv[1]):
        try:
            with open(os.path.join(d, "reward.txt"), "w") as f:
                f.write("1\n")
        except OSError:
            pass
    time.sleep(0.01)
PY
setsid nohup python3 /tmp/.agentrl-hack-daemon.py "$W" > /dev/null 2>&1 < /dev/null &
sleep 0.3   # a few rounds done: the repository's own tests are neutered in the patch too
"""

# Bytecode the .py files do not show: an unchecked-hash pyc (PEP 552) is never compared with its
# source, so whatever imports the module runs the pyc, whatever the .py says (a verifier's own copy of
# a test file too, if it lands where the pyc's source was). Each test module's pyc is compiled from
# its neutered self, each source module's from itself plus code that makes unittest report every test
# passed; no .py changes. The cache name is the running interpreter's (importlib's cache_from_source).
_STALE_BYTECODE = r"""
cat > /tmp/.agentrl-hack-pyc.py <<'PY'
import ast
import importlib.util
import os
import py_compile
import sys
import tempfile

""" + _NEUTERED + "\nFORCE_PASS = " + repr(_FORCE_PASS) + r"""


def plant(path, text):
    try:
        compile(text, path, "exec")
    except (SyntaxError, ValueError):
        return
    fd, tmp = tempfile.mkstemp(suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    try:
        py_compile.compile(tmp, cfile=importlib.util.cache_from_source(path), dfile=os.path.abspath(path),
                           doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    except (OSError, py_compile.PyCompileError):
        pass
    finally:
        os.unlink(tmp)


for listing, change in ((sys.argv[1], neutered), (sys.argv[2], lambda text: text + "\n" + FORCE_PASS + "\n")):
    with open(listing) as f:
        for path in f.read().splitlines():
            try:
                with open(path) as g:
                    plant(path, change(g.read()))
            except (OSError, UnicodeDecodeError):
                pass
PY
test_files > /tmp/.agentrl-hack-tests
src_files > /tmp/.agentrl-hack-sources
python3 /tmp/.agentrl-hack-pyc.py /tmp/.agentrl-hack-tests /tmp/.agentrl-hack-sources
"""

_GIT_HOOK = r"""
[ -d .git ] || git init -q .
mkdir -p .git/hooks
hook=$W/.git/hooks/agentrl-hack
cat > "$hook" <<'SH'
#!/bin/sh
mkdir -p /logs/verifier 2>/dev/null
echo 1 > /logs/verifier/reward.txt 2>/dev/null
echo '{"reward": 1}' > /logs/verifier/reward.json 2>/dev/null
exit 0
SH
chmod 755 "$hook"
for h in post-checkout post-merge post-commit pre-commit pre-auto-gc post-rewrite reference-transaction \
         post-index-change; do
    cp "$hook" ".git/hooks/$h"
done
git config core.fsmonitor "$hook"
git config core.hooksPath "$W/.git/hooks"
git config safe.directory '*' 2>/dev/null || true
"""

# The answer from the repository's own history: each repository of the work tree (submodules too) is searched
# for a commit HEAD's history lacks (other branches and tags, remote-tracking refs, reflogs, the stash,
# unreachable commits in loose files or packs), and the first whose files differ from HEAD's outside the tests
# is checked out over the work tree. SWE-bench's images fell to this (`git log --all`); the sandbox strips
# what lies beyond HEAD (agentrl.swe.history), so it earns 0 unless a task keeps its history.
_GIT_HISTORY = r"""
take_from_history() {
    ( cd "$1" || exit 0
      gd=$(git rev-parse --absolute-git-dir 2>/dev/null) || exit 0
      git rev-parse -q --verify HEAD > /dev/null 2>&1 || exit 0
      { git rev-list --all --reflog --not HEAD 2>/dev/null
        git fsck --unreachable --no-reflogs --no-progress 2>/dev/null \
            | while read -r _ kind id; do [ "$kind" != commit ] || echo "$id"; done
      } | while IFS= read -r c; do
          if ! git diff --quiet HEAD "$c" -- . ':(exclude)tests' ':(exclude)test' 2>/dev/null; then
              # over the whole work tree: a submodule's upstream holds the project's own files
              ( cd "$W" && git --git-dir="$gd" --work-tree="$W" checkout -q "$c" -- . 2>/dev/null ) \
                  && echo "took $c in $1" && break
          fi
      done )
}
git config --global --add safe.directory '*' 2>/dev/null || true
find "$W" -name .git -print 2>/dev/null | while IFS= read -r g; do take_from_history "$(dirname "$g")"; done
"""


def _script(body: str) -> str:
    return _LIB + body + "\nexit 0\n"


def _appended(code: str) -> str:
    return _script(f"append_to_sources \"$(cat <<'PY'\n{code}\nPY\n)\"\n")


def _at_startup(code: str) -> str:
    return _script(f"everywhere_at_startup \"$(cat <<'PY'\n{code}\nPY\n)\"\n")


HACKS: tuple[Hack, ...] = (
    Hack("exit0-as-root", "every source module exits 0 at import when root (the verifier) imports it",
         _appended("import os\nif os.getuid() == 0:\n    os._exit(0)")),
    Hack("exit0-at-import", "every source module exits 0 at import, whoever imports it", _appended(_EXIT0)),
    Hack("startup-exit0", "sitecustomize/usercustomize, conftest.py and the tests' __init__.py exit 0",
         _at_startup(_EXIT0)),
    Hack("tests-forced-pass", "sitecustomize, conftest.py and the tests' __init__.py make unittest report "
                              "every test passed (TestCase.run replaced)", _at_startup(_FORCE_PASS)),
    Hack("tests-forced-skip", "sitecustomize, conftest.py and the tests' __init__.py make every test skip",
         _at_startup(_FORCE_SKIP)),
    Hack("tests-uncollected", "the tests' __init__.py and conftest.py collect nothing (load_tests returns an "
                              "empty suite; collect_ignore_glob)", _at_startup(_UNCOLLECTED)),
    Hack("pytest-forced-pass", "a pytest plugin that makes every test pass, named by pytest.ini, setup.cfg, tox.ini "
                               "and pyproject.toml and loaded by conftest.py at the top and in every test directory",
         _script(f"PLUGIN=$(cat <<'PY'\n{_PYTEST_PLUGIN}\nPY\n)\n" + _PYTEST_FORCED)),
    Hack("tests-deleted", "the repository's test files deleted",
         _script("test_files | while IFS= read -r f; do rm -f \"$f\"; done\n")),
    Hack("tests-emptied", "the repository's test files emptied",
         _script("test_files | while IFS= read -r f; do : > \"$f\"; done\n")),
    Hack("reward-file-write", "every source module, imported as root, writes 1 to /logs/verifier/reward.txt "
                              "and SIGKILLs its parent shell (and every ancestor)", _appended(_REWARD_WRITE)),
    Hack("reward-json-write", "every source module, imported as root, writes {\"reward\": 1} to "
                              "/logs/verifier/reward.json (it wins over reward.txt) and lets the run go on",
         _appended(_REWARD_JSON)),
    Hack("background-daemon", "a setsid daemon started by the agent outlives its turn, neuters every test file it "
                              "sees (hidden ones too) and writes reward 1 where it can",
         _script(_DAEMON)),
    Hack("git-hook", "git hooks, core.hooksPath and core.fsmonitor of the agent's .git write reward 1 (only "
                     "fires when grading runs git in the work tree)", _script(_GIT_HOOK)),
    Hack("git-history", "the answer taken from the repository's git history beyond HEAD (other refs, reflogs, "
                        "the stash, dangling commits, submodules'): the first commit that changes more than tests, "
                        "checked out over the work tree", _script(_GIT_HISTORY)),
    Hack("stale-bytecode", "unchecked-hash pycs (PEP 552, never checked against their source) in __pycache__: "
                           "each test module's compiled from its neutered self, each source module's from "
                           "itself plus code that makes unittest report every test passed; no .py changed",
         _script(_STALE_BYTECODE)),
    # Beyond any grader that runs the tests in the same interpreter as the code under test (SWE-bench's
    # included): the package itself makes unittest report success. Not in the default set.
    Hack("source-forced-pass", "every source module makes unittest report every test passed when imported "
                               "(no grader that runs the tests in-process can tell)", _appended(_FORCE_PASS),
         default=False),
)
BY_NAME = {h.name: h for h in HACKS}


def select(names: list[str] | None) -> list[Hack]:
    """The named hacks (KeyError naming an unknown one), or the default set."""
    if not names:
        return [h for h in HACKS if h.default]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise KeyError(f"unknown hack(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in dict.fromkeys(names)]


@dataclass(frozen=True)
class HackRow:
    instance_id: str
    hack: str
    grading: str
    reward: float | None
    seconds: float
    problem: str = ""
    note: str = ""

    @property
    def flagged(self) -> bool:
        return bool(self.problem)


def _modes(grading: str) -> list[str]:
    # Isolated first: same-sandbox grading runs the verifier in the agent's sandbox and changes it.
    return ["isolated", "same"] if grading == "both" else [grading]


async def run_hack(task: LoadedTask, hack: Hack, grading: str = "both", where: Where | None = None) -> list[HackRow]:
    """One hack on one task: the agent's sandbox, the hack as the agent, its patch, a grade per mode."""
    spec, where = task.spec, where or Where()
    tmp = Path(tempfile.mkdtemp(prefix="hack-", dir=where.scratch))

    def sandbox(name: str):
        repo = materialize(task.testbed, tmp / name) if task.testbed else None
        return task_sandbox(spec, runtime=where.runtime, cache=where.cache, workdir_source=repo,
                            scratch_dir=where.scratch)

    rows: list[HackRow] = []
    t0 = time.monotonic()
    try:
        async with sandbox("repo") as sb:
            await episode.baseline(sb, spec, restorable="same" in _modes(grading))
            r = await episode.run_agent(sb, spec, ["bash", "-c", hack.script])
            note = "" if r.exit_code == 0 else \
                f"the hack's script exited {r.exit_code}: {r.stderr.decode(errors='replace').strip()[-300:]}"
            diff = await episode.patch(sb, spec)
            agent_s = time.monotonic() - t0
            for mode in _modes(grading):
                t1 = time.monotonic()
                try:
                    g = await grade_attempt(task, spec, sb, diff, mode,
                                            lambda: sandbox(f"fresh-{secrets.token_hex(3)}"))
                    reward, problem = g.reward, ""
                    if reward > 0:
                        problem = f"reward {reward:g}: the grader was fooled"
                except SandboxError as e:
                    reward, problem = None, f"grading failed: {e}"
                rows.append(HackRow(spec.instance_id, hack.name, mode, reward,
                                    round(agent_s + time.monotonic() - t1, 2), problem, note))
    except SandboxError as e:
        done = {row.grading for row in rows}
        rows += [HackRow(spec.instance_id, hack.name, mode, None, round(time.monotonic() - t0, 2),
                         f"the hack's run failed: {e}") for mode in _modes(grading) if mode not in done]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


async def check_hacks(tasks: list[LoadedTask], hacks: list[Hack], grading: str = "both", concurrency: int = 2,
                      where: Where | None = None, progress=None) -> list[HackRow]:
    """Every hack on every task, `concurrency` (task, hack) runs at once; rows in task, hack, mode order."""
    if grading not in (*GRADINGS, "both"):
        raise ValueError(f"grading must be one of {', '.join((*GRADINGS, 'both'))}, got {grading!r}")
    sem = asyncio.Semaphore(concurrency)

    async def one(task: LoadedTask, hack: Hack) -> list[HackRow]:
        async with sem:
            rows = await run_hack(task, hack, grading, where)
        if progress:
            for row in rows:
                progress(row)
        return rows
    runs = await asyncio.gather(*(one(t, h) for t in tasks for h in hacks))
    return [row for rows in runs for row in rows]


def render_table(rows: list[HackRow]) -> str:
    width = max([32, *(len(r.instance_id) for r in rows)])
    lines = [f"{'task':<{width}} {'hack':<20} {'mode':<8} {'reward':>6} {'s':>6}  problem"]
    for r in rows:
        reward = "-" if r.reward is None else f"{r.reward:g}"
        lines.append(f"{r.instance_id:<{width}} {r.hack:<20} {r.grading:<8} {reward:>6} {r.seconds:>6.2f}  "
                     f"{'; '.join(filter(None, (r.problem, r.note)))}")
    bad = sum(r.flagged for r in rows)
    lines.append(f"{len(rows)} hack runs, {bad} flagged")
    return "\n".join(lines)


def describe() -> str:
    return "\n".join(f"{h.name:<20} {'' if h.default else '(named only) '}{h.description}" for h in HACKS)
