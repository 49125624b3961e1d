"""The task's grader: the reward comes from test results, never from an exit code.

    python3 -I grade.py stop
        Kill every process of the test user (below). In a same-sandbox grading that user is
        the agent, so nothing the agent left running edits the tree while it is graded. Only
        in a pid namespace of its own (a sandbox, a container), never on a host.
    python3 -I grade.py place TESTS_DIR
        Put the verifier's tests (TESTS_DIR: /tests) in place of the work tree's: deleted,
        emptied or edited test files, or an __init__.py or conftest.py of the agent's, do not
        count. TESTS_DIR/suite/ is the repository's tests/ tree, or, when expected.json names
        "test_dirs", the test directories at their own paths with the conftest.py files above
        them (place_suite); without suite/, TESTS_DIR/test_*.py go to tests/. A directory on the
        way that the agent made a link (or a file) becomes a real one: nothing is followed.
    python3 -I grade.py run --expected EXPECTED.json --log LOG --reward REWARD -- PYTHON
        Run the suite in tests/ with PYTHON as the test user, with its output in LOG: unittest's
        verbose run, or pytest's when EXPECTED.json says "runner": "pytest" (RUNNERS). Then
        write REWARD: 1 only if every test that EXPECTED.json names (FAIL_TO_PASS and
        PASS_TO_PASS, SWE-bench's keys) is reported passed by a run that reached its summary.
        With "test_dirs", unittest discovers each of them (its package's top level found by
        walking up the __init__.py files) in one run, and pytest collects them.
        Skipped, expected failure, failure, error, missing, a run that died early: 0.
        The exit code plays no part. Exits 0 when the reward is 1, else 1.

The test user is the owner of the work tree (the current directory) when the verifier runs
as root and the tree is not root's: in agentrl's sandboxes the agent's uid. So the code under
test is not root: it cannot write the reward, rewrite /tests, or kill this script and the
shell that reads the reward. The expected names are read before the code under test runs,
and the run is killed with everything the test user left running before the log is read.

pytest runs with no configuration of the repository's (-c /dev/null, --rootdir .) and only the
conftest.py files of tests/ (--confcutdir tests), which are the verifier's copies: a pytest.ini,
setup.cfg, pyproject.toml or conftest.py the agent leaves at the root is not read.

The same file, byte for byte, in every task: its one source is agentrl/swe/verifier/ (a test checks the copies).
"""

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

HEAD = re.compile(r"^([^\s(]+) \(([A-Za-z_][\w.]*)\)(?: \.\.\. (.*))?$")  # "test_x (pkg.mod.C.test_x) ... ok"
FAILED_HEAD = re.compile(r"^(FAIL|ERROR|UNEXPECTED SUCCESS): ([^\s(]+) \(([A-Za-z_][\w.]*)\)")
RAN = re.compile(r"^Ran \d+ tests? in [\d.]+s$")
VERDICT = re.compile(r"^(?:OK|FAILED)(?: \(.*\))?$")
# pytest's -rA summary, after its header: one line per test, by node id (tests/test_x.py::TestC::test_y)
SUMMARY_HEAD = re.compile(r"^=+ short test summary info =+$")
SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S+?)(?: - .*)?$")
SUMMARY_END = re.compile(r"^=+ .* in [\d.]+s(?: \([\d:]+\))? =+$")
INTERRUPTED = re.compile(r"^!+ .*Interrupted")
PYTEST_STATUS = {"PASSED": "ok", "FAILED": "FAIL", "ERROR": "ERROR", "XFAIL": "expected failure",
                 "XPASS": "UNEXPECTED SUCCESS"}
RUNNERS = {      # what follows the interpreter, run in the repository with the verifier's tests/ in place
    "unittest": ["-I", "-B", "-m", "unittest", "discover", "-v", "-b", "-s", "tests", "-t", "."],
    "pytest": ["-I", "-B", "-m", "pytest", "-rA", "--tb=native", "-p", "no:cacheprovider", "-c", "/dev/null",
               "--rootdir", ".", "--confcutdir", "tests", "tests"],
}
# unittest over several test directories in one run (unittest discover takes one): each is discovered with
# its package's top level (the first directory up without an __init__.py), and one runner reports them all
# as `unittest discover -v -b` does. Python 3.6 runs it.
DISCOVER_DIRS = (
    "import os, sys, unittest\n"
    "suite = unittest.TestSuite()\n"
    "for start in sys.argv[1:]:\n"
    "    top = os.path.dirname(start)\n"
    "    while top and os.path.isfile(os.path.join(top, '__init__.py')):\n"
    "        top = os.path.dirname(top)\n"
    "    suite.addTests(unittest.TestLoader().discover(start, top_level_dir=top or '.'))\n"
    "sys.exit(not unittest.TextTestRunner(verbosity=2, buffer=True).run(suite).wasSuccessful())\n")
INIT_PID_NS = 0xEFFFFFFC   # the inode of the kernel's initial pid namespace (PROC_PID_INIT_INO)


def test_id(name, where):
    """unittest's id: 'pkg.mod.Class.test_x' (Python 3.11 prints it; earlier ones print 'pkg.mod.Class')."""
    return where if where.endswith("." + name) else f"{where}.{name}"


def runner_command(runner, test_dirs=None):
    """What follows the interpreter: RUNNERS's line, or with `test_dirs` (repository paths) the same runner
    over those directories."""
    if not test_dirs:
        return list(RUNNERS[runner])
    if runner == "pytest":
        # conftest.py files above the test directories are the verifier's copies too (place_suite)
        return RUNNERS["pytest"][:-3] + ["--confcutdir", ".", *test_dirs]
    return ["-I", "-B", "-c", DISCOVER_DIRS, *test_dirs]


def check_test_dirs(dirs):
    """`dirs` as expected.json may name them: distinct relative paths inside the repository."""
    if not isinstance(dirs, list) or not dirs or not all(isinstance(d, str) for d in dirs):
        raise ValueError("test_dirs must be a non-empty list of directories")
    for d in dirs:
        parts = d.split("/")
        if d.startswith("/") or any(p in ("", ".", "..") for p in parts) or d.startswith("-"):
            raise ValueError(f"test_dirs: {d!r} is not a relative path inside the repository")
    if len(set(dirs)) != len(dirs) or any(a != b and b.startswith(a + "/") for a in dirs for b in dirs):
        raise ValueError(f"test_dirs: {dirs} repeat or nest")
    return dirs


def normalize(name):
    m = HEAD.match(name.strip())
    return test_id(m.group(1), m.group(2)) if m else name.strip()


def load_expected(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out = {}
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        names = data.get(key) or []
        if isinstance(names, str):          # a SWE-bench record keeps them as JSON text
            names = json.loads(names)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{path}: {key} must be a list of test names")
        out[key] = [normalize(n) for n in names]
    if not out["FAIL_TO_PASS"]:
        raise ValueError(f"{path}: FAIL_TO_PASS names no test: nothing would tell a fix from no change")
    out["runner"] = data.get("runner", "unittest")
    if out["runner"] not in RUNNERS:
        raise ValueError(f"{path}: runner must be one of {sorted(RUNNERS)}, got {out['runner']!r}")
    try:
        out["test_dirs"] = check_test_dirs(data["test_dirs"]) if "test_dirs" in data else None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return out


def parse(text, runner="unittest"):
    """({test id: status}, reached the summary). A test reported twice keeps its worst status."""
    if runner == "pytest":
        return parse_pytest(text)
    status, failed, ran, verdict, pending = {}, {}, False, False, None

    def record(tid, word):
        word = word.strip()
        s = ("ok" if word == "ok" else "skipped" if word.startswith("skipped") else
             "expected failure" if word == "expected failure" else word or "no result")
        if status.get(tid, "ok") == "ok":
            status[tid] = s

    for line in text.splitlines():
        if RAN.match(line):
            ran, verdict = True, False
            continue
        if ran and VERDICT.match(line):
            verdict = True
            continue
        m = HEAD.match(line)
        if m:
            tid = test_id(m.group(1), m.group(2))
            if m.group(3) is None:           # a docstring's line (or the test's own output) comes first
                pending = tid
            else:
                record(tid, m.group(3))
                pending = None
            continue
        if pending and " ... " in line:
            record(pending, line.rsplit(" ... ", 1)[1])
            pending = None
            continue
        f = FAILED_HEAD.match(line)
        if f:
            failed[test_id(f.group(2), f.group(3))] = f.group(1)
    status.update(failed)                    # a failing subtest, or an error in tearDown after "ok"
    return status, ran and verdict


def parse_pytest(text):
    """({node id: status}, reached the summary) from pytest -rA's summary lines; the worst status of a test
    reported twice (passed, then an error in its teardown) stands. Skipped tests have no line: missing."""
    status, listing, ended, interrupted = {}, False, False, False
    for line in text.splitlines():
        if SUMMARY_HEAD.match(line):
            listing = True
        elif INTERRUPTED.match(line):
            interrupted = True
        elif SUMMARY_END.match(line):
            ended, listing = True, False
        elif listing:
            m = SUMMARY_LINE.match(line)
            if m and status.get(m.group(2), "ok") == "ok":
                status[m.group(2)] = PYTEST_STATUS[m.group(1)]
    return status, ended and not interrupted


def write_reward(path, value):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".reward-")
    with os.fdopen(fd, "w") as f:
        f.write(f"{value}\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def test_user():
    """(uid, gid) the tests run as, or None to stay who we are (not root, or the tree is root's)."""
    st = os.stat(".")
    if os.geteuid() != 0 or st.st_uid == 0:
        return None
    return st.st_uid, st.st_gid


def processes_of(uid):
    mine, out = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(pid) != mine and int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            out.append(int(pid))
    return out


def own_pid_namespace():
    """In a sandbox or container (a pid namespace of its own), not on a host: there, killing every
    process of a user would reach the user's whole session."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino != INIT_PID_NS
    except OSError:
        return False


def stop(user):
    """SIGKILL every process of `user`, from a child that has become that user (kill(-1) as that
    uid reaches exactly its processes, atomically with respect to fork). Only in a pid namespace
    of our own."""
    if user is None or not own_pid_namespace():
        return
    uid, gid = user
    for _ in range(20):
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
            except BaseException:
                os._exit(1)
            os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.01)
        if not processes_of(uid):
            return
    raise SystemExit(f"grade.py: processes of uid {uid} survive SIGKILL: {processes_of(uid)}")


def remove(path):
    """`path` gone, whatever it is; a directory's links are removed, never followed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def real_dirs(path):
    """Each directory from the work tree down to `path` a real one: a link or a file on the way, the agent's,
    is replaced by a directory (so nothing written below it lands elsewhere)."""
    here = ""
    for part in [p for p in path.split("/") if p]:
        here = os.path.join(here, part)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            os.unlink(here)
            st = None
        if st is None:
            os.mkdir(here, 0o755)


def copy_in(source, target):
    """The file `source` written at `target` (a relative path), its directories real ones first."""
    real_dirs(os.path.dirname(target))
    remove(target)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as out, open(source, "rb") as f:
        shutil.copyfileobj(f, out)


def place_suite(tests_dir, test_dirs):
    """The work tree's test directories (and with `test_dirs`, every conftest.py above them) replaced by the
    verifier's copies."""
    suite = os.path.join(tests_dir, "suite")
    if test_dirs is None:
        dirs, into = ["tests"], "tests"
    else:
        dirs, into = test_dirs, ""
    for d in dirs:
        real_dirs(os.path.dirname(d))
        remove(d)
    if test_dirs is not None:
        above = {""}
        for d in dirs:
            parts = d.split("/")
            above.update("/".join(parts[:i]) for i in range(1, len(parts)))
        for a in sorted(above):
            remove(os.path.join(a, "conftest.py"))
    if not os.path.isdir(suite):            # a task of the verifier's own test modules: tests/test_*.py
        real_dirs("tests")
        with open(os.path.join("tests", "__init__.py"), "wb"):
            pass
        for name in sorted(os.listdir(tests_dir)):
            if name.startswith("test_") and name.endswith(".py"):
                copy_in(os.path.join(tests_dir, name), os.path.join("tests", name))
        return
    for d in dirs:
        real_dirs(d if into == "" else into)
    for where, _, names in sorted(os.walk(suite)):
        rel = os.path.relpath(where, suite)
        for name in sorted(names):
            target = os.path.normpath(os.path.join(into, rel, name))
            copy_in(os.path.join(where, name), target)


def place(tests_dir):
    try:
        expected = load_expected(os.path.join(tests_dir, "expected.json"))
    except (OSError, ValueError) as e:
        print(f"grade.py: cannot read the expected tests: {e}", file=sys.stderr)
        return 2
    try:
        place_suite(tests_dir, expected["test_dirs"])
    except OSError as e:
        print(f"grade.py: cannot put the tests in place: {e}", file=sys.stderr)
        return 2
    return 0


def run(expected_path, log_path, reward_path, python):
    write_reward(reward_path, 0)
    try:
        expected = load_expected(expected_path)
    except (OSError, ValueError) as e:
        print(f"grade.py: cannot read the expected tests: {e}", file=sys.stderr)
        return 2
    user = test_user()
    home = tempfile.mkdtemp(prefix="grade-home-")
    # PYTEST_ADDOPTS, PYTEST_PLUGINS: the run's options are RUNNERS's alone
    env = dict({k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, HOME=home)
    command = [python, *runner_command(expected["runner"], expected["test_dirs"])]
    become = None
    if user is not None:
        os.chown(home, *user)
        env.pop("USER", None)
        env.pop("LOGNAME", None)

        def become():                        # preexec_fn: Python 3.6 has it, not subprocess's user=
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])
    with open(log_path, "wb") as log:
        try:
            subprocess.call(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=become)
        except (OSError, subprocess.SubprocessError) as e:
            log.write(f"grade.py: cannot run {command}: {e}\n".encode())
    stop(user)                               # whatever the test run left behind
    with open(log_path, "rb") as log:
        text = log.read().decode("utf-8", errors="replace")
    shown = text if len(text) <= 1 << 20 else "[... the log's first part left out]\n" + text[-(1 << 20):]
    sys.stderr.write(shown)
    sys.stderr.flush()
    status, complete = parse(text, expected["runner"])
    lines, passed = [], complete
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        for tid in expected[key]:
            s = status.get(tid, "missing")
            passed = passed and s == "ok"
            lines.append(f"  {key} {tid}: {s}")
    named = len(expected["FAIL_TO_PASS"]) + len(expected["PASS_TO_PASS"])
    ok = sum(status.get(t) == "ok" for k in ("FAIL_TO_PASS", "PASS_TO_PASS") for t in expected[k])
    print(f"grade.py: {ok} of {named} named tests ok" + ("" if complete else "; the run never reached its summary"))
    print("\n".join(lines))
    write_reward(reward_path, 1 if passed else 0)
    print(f"reward {1 if passed else 0}")
    shutil.rmtree(home, ignore_errors=True)
    return 0 if passed else 1


def main(argv):
    if argv[:1] == ["stop"] and len(argv) == 1:
        stop(test_user())
        return 0
    if argv[:1] == ["place"] and len(argv) == 2:
        return place(argv[1])
    if argv[:1] == ["run"] and "--" in argv:
        opts, python = argv[1:argv.index("--")], argv[argv.index("--") + 1:]
        keys = {opts[i]: opts[i + 1] for i in range(0, len(opts) - 1, 2)}
        if len(opts) == 6 and sorted(keys) == ["--expected", "--log", "--reward"] and len(python) == 1:
            return run(keys["--expected"], keys["--log"], keys["--reward"], python[0])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
