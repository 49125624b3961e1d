"""The Apptainer runtime against a fake `apptainer`, the local runtime, and the factory.

Apptainer cannot be installed here, so a fake `apptainer` (written per test, first on PATH)
records every call (argv, its own environment, the --env-file's text) and emulates the commands
by running them on the host: `instance start` starts a detached `sleep 864242` as the instance,
`exec` runs the command in the --pwd with exactly the --env-file's environment, mapping bind
destinations in arguments to their host sources, `instance stop` kills it, `instance list --json`
prints the JSON Apptainer prints, `overlay create` makes a sparse file.
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request

import pytest
from http_fixtures import Hello, UnixHTTPServer

from hpc.sandbox.apptainer import (
    FORWARDER_HOST,
    ApptainerSandbox,
    InstancePaths,
    env_file_text,
    exec_argv,
    instance_start_argv,
    overlay_create_argv,
    stop_argv,
)
from hpc.sandbox.base import SandboxError, SandboxSpec
from hpc.sandbox.bwrap import BwrapSandbox
from hpc.sandbox.factory import make_sandbox
from hpc.sandbox.local import LocalSandbox
from hpc.sandbox.policy import dropped_capabilities

pytestmark = pytest.mark.integration

FAKE = r'''
import json, os, shlex, signal, subprocess, sys, time
STATE = __STATE__
VALUED = {"--network", "--overlay", "--workdir", "--home", "--bind", "--env-file", "--pwd", "--size", "--timeout",
          "--drop-caps", "--security"}

def parse(args):
    opts, i = {}, 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in VALUED:
            opts.setdefault(args[i], []).append(args[i + 1])
            i += 2
        else:
            opts.setdefault(args[i], []).append(True)
            i += 1
    return opts, args[i:]

def state(name):
    p = os.path.join(STATE, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None

def alive(pid):
    # A zombie is dead: the orphaned sleeper is reaped by the host's init, which may take seconds.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False

args = sys.argv[1:]
rec = {"argv": args, "env": dict(os.environ), "t": time.time()}
opts, rest = parse(args[2:] if args[0] in ("instance", "overlay") else args[1:])
if "--env-file" in opts:
    rec["env_file"] = open(opts["--env-file"][0]).read()
with open(os.path.join(STATE, "log.jsonl"), "a") as f:
    f.write(json.dumps(rec) + "\n")

if args[:2] == ["overlay", "create"]:
    with open(rest[0], "wb") as f:
        f.truncate(int(opts["--size"][0]) << 20)
elif args[:2] == ["instance", "start"]:
    if os.path.exists(os.path.join(STATE, "fail-start")):
        sys.exit("FATAL:   container creation failed: mount hook function failure")
    image, name = rest
    # An instance's init handles its own signals, whatever its starter inherited (a shell's background job
    # ignores SIGINT, and the sleeper would too)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    home = opts["--home"][0].split(":")
    binds = [b.split(":")[:2] for b in opts.get("--bind", [])] + [home]
    sleeper = subprocess.Popen(["sleep", "864242"], start_new_session=True, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(STATE, name + ".json"), "w") as f:
        json.dump({"pid": sleeper.pid, "image": image, "binds": binds, "home": home[1]}, f)
elif args[:2] == ["instance", "list"]:
    st = state(rest[0])
    insts = [] if st is None or not alive(st["pid"]) else [
        {"instance": rest[0], "pid": st["pid"], "img": st["image"], "ip": "", "logErrPath": "", "logOutPath": ""}]
    print(json.dumps({"instances": insts}, indent="\t"))
elif args[:2] == ["instance", "stop"]:
    st = state(rest[0])
    if st is None:
        sys.exit("FATAL:   no instance found")
    os.kill(st["pid"], signal.SIGKILL if "--force" in opts else signal.SIGINT)
    deadline = time.monotonic() + float(opts.get("--timeout", ["10"])[0])
    while alive(st["pid"]):
        if time.monotonic() > deadline:     # as Apptainer: SIGKILL once the grace is over
            os.kill(st["pid"], signal.SIGKILL)
        time.sleep(0.01)
    os.unlink(os.path.join(STATE, rest[0] + ".json"))
    with open(os.path.join(STATE, "stopped.jsonl"), "a") as f:     # when each stop returned: a failure's story
        f.write(json.dumps({"name": rest[0], "t": time.time()}) + "\n")
elif args[0] == "exec" and rest[1:] == ["kill", "-9", "-1"]:
    pass    # in an instance this is its own pid namespace; on this host it would be every process
elif args[0] == "exec":
    st = state(rest[0][len("instance://"):])
    def host(a):
        for src, dst in sorted(st["binds"], key=lambda b: -len(b[1])):
            if a == dst or a.startswith(dst + "/"):
                return src + a[len(dst):]
        return a
    env = {}
    for line in rec["env_file"].splitlines():
        k, _, v = line.partition("=")
        env[k] = shlex.split(v)[0] if v else ""
    env["HOME"] = st["home"]        # as Apptainer: HOME is --home's destination, never the env's
    os.chdir(host(opts["--pwd"][0]))
    os.execvpe(rest[1], [host(a) for a in rest[1:]], env)
else:
    sys.exit("fake apptainer: unknown command " + " ".join(args))
'''


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.fixture
def repo(tmp_path):
    src = tmp_path / "repo"
    src.mkdir()
    (src / "app.py").write_text("print('hello from the sandbox')\n")
    return src


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake apptainer first on PATH; returns (state dir, a function reading its call log)."""
    state, bindir = tmp_path / "fake-state", tmp_path / "bin"
    state.mkdir()
    bindir.mkdir()
    exe = bindir / "apptainer"
    exe.write_text(f"#!{sys.executable}\n" + FAKE.replace("__STATE__", repr(str(state))))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    monkeypatch.setenv("APPTAINERENV_SECRET", "do-not-leak")

    def calls():
        log = state / "log.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return state, calls


@pytest.fixture
def image(tmp_path):
    sif = tmp_path / "task.sif"
    sif.write_bytes(b"SIF")
    return str(sif)


def verbs(calls):
    return [" ".join(c["argv"][:2]) if c["argv"][0] in ("instance", "overlay") else c["argv"][0] for c in calls]


def processes(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


# --- Apptainer --------------------------------------------------------------------------------

def test_lifecycle_command_lines_and_no_host_environment(fake, repo, image, tmp_path):
    _, calls = fake

    async def go():
        spec = SandboxSpec(workdir_source=str(repo), env={"TASK": "t1"}, ro_binds={"/opt": "/tools"},
                           scratch_dir=str(tmp_path))
        async with ApptainerSandbox(spec, image) as sb:
            r = await sb.exec("pwd; echo $TASK $HOME; echo ${SECRET_TOKEN:-none}; python3 app.py")
            fail = await sb.exec(["sh", "-c", "echo oops >&2; exit 7"], env={"EXTRA": "a,b c$'"})
            scratch = sb._scratch
            return sb, r, fail, scratch
    sb, r, fail, scratch = run(go())
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().splitlines()[1:] == ["t1 /home/agent", "none", "hello from the sandbox"]
    assert (fail.exit_code, fail.stderr) == (7, b"oops\n")
    log = calls()
    stopped = fake[0] / "stopped.jsonl"
    story = "\n".join([f"{c['t']:.2f} {' '.join(c['argv'])}" for c in log] +
                      [f"stopped: {stopped.read_text() if stopped.exists() else 'never'}"])
    assert verbs(log) == ["overlay create", "instance start", "instance list", "exec", "exec",
                          "instance stop", "instance list"], story
    name = sb.name
    assert log[0]["argv"] == ["overlay", "create", "--size", "16384", "--sparse", f"{scratch}/overlay.img"]
    start = log[1]["argv"]
    assert start[:11] == ["instance", "start", "--containall", "--cleanenv", "--net", "--network", "none",
                          "--no-privs", "--security", f"seccomp:{scratch}/seccomp.json", "--overlay"]
    assert "--fakeroot" not in start and start[-2:] == [image, name]
    binds = [start[i + 1] for i, a in enumerate(start) if a == "--bind"]
    assert binds[0].endswith(":/testbed") and binds[0].startswith(str(tmp_path)) and binds[1] == "/opt:/tools:ro"
    assert start[start.index("--home") + 1] == f"{scratch}/home:/home/agent"
    ex = log[3]["argv"]
    assert ex[:5] == ["exec", "--cleanenv", "--no-privs", "--security", f"seccomp:{scratch}/seccomp.json"]
    assert ex[5] == "--env-file" and ex[7:10] == ["--pwd", "/testbed", f"instance://{name}"]
    assert log[4]["argv"][-3:] == ["sh", "-c", "echo oops >&2; exit 7"]
    assert "EXTRA='a,b c$'\"'\"''" in log[4]["env_file"]        # quoted, commas and all
    assert "HOME=" not in log[4]["env_file"]
    assert log[5]["argv"] == ["instance", "stop", "--timeout", "10", name]
    for c in log:   # nothing of the host's environment reaches apptainer or the command
        assert "SECRET_TOKEN" not in c["env"] and "APPTAINERENV_SECRET" not in c["env"]
        assert set(c["env"]) <= {"PATH", "LANG", "HOME"}
        assert "do-not-leak" not in json.dumps(c)
    assert not scratch.exists() and sorted(p.name for p in repo.iterdir()) == ["app.py"]


def test_files_round_trip_through_exec_and_copy_on_write(fake, repo, image):
    payload = os.urandom(1 << 16)

    async def go():
        async with ApptainerSandbox(SandboxSpec(workdir_source=str(repo)), image) as sb:
            await sb.write_file("/testbed/sub/data.bin", payload, user="agent")
            await sb.exec("echo changed > app.py")
            got = await sb.read_file("/testbed/sub/data.bin")
            with pytest.raises(FileNotFoundError):
                await sb.read_file("/testbed/missing")
            return got
    assert run(go()) == payload
    assert (repo / "app.py").read_text() == "print('hello from the sandbox')\n"


def test_fakeroot_only_when_asked(fake, image):
    _, calls = fake

    async def go():
        async with ApptainerSandbox(SandboxSpec(), image, fakeroot=True) as sb:
            return await sb.exec("echo $HOME", user="root", cwd="/")
    assert run(go()).stdout == b"/root\n"
    overlay, start = calls()[0]["argv"], calls()[1]["argv"]
    assert "--fakeroot" in overlay and "--fakeroot" in start
    assert start[start.index("--home") + 1].endswith("/home:/root")
    # fake root keeps what grading needs (chown, setuid...) and no more; seccomp as for bwrap
    dropped = start[start.index("--drop-caps") + 1].split(",")
    assert {"CAP_SYS_ADMIN", "CAP_MKNOD", "CAP_SYS_MODULE", "CAP_NET_ADMIN", "CAP_SYS_PTRACE"} <= set(dropped)
    assert not {"CAP_CHOWN", "CAP_SETUID", "CAP_DAC_OVERRIDE"} & set(dropped) and "--no-privs" not in start


def test_timeout_kills_the_exec_process_group(fake, image):
    async def go():
        async with ApptainerSandbox(SandboxSpec(), image) as sb:
            return await sb.exec("sleep 3071 & sleep 3072 & wait", cwd="/", timeout_s=1)
    r = run(go())
    assert r.timed_out and r.duration_s < 10
    assert not processes("sleep 307") and not processes("sleep 864242")


def test_a_failed_start_stops_and_cleans_up(fake, image, tmp_path):
    state, calls = fake
    (state / "fail-start").touch()
    sb = ApptainerSandbox(SandboxSpec(scratch_dir=str(tmp_path / "scratch")), image)
    (tmp_path / "scratch").mkdir()
    with pytest.raises(SandboxError, match="instance start exited with 1: FATAL.*mount hook"):
        run(sb.start())
    assert verbs(calls()) == ["overlay create", "instance start", "instance stop", "instance list"]
    assert list((tmp_path / "scratch").iterdir()) == []
    with pytest.raises(SandboxError, match="before start"):
        run(sb.exec("true"))


def test_a_failed_forwarder_stops_the_instance(fake, image, tmp_path):
    _, calls = fake
    with socket.socket() as taken:      # the forwarder's port is in use: it fails to listen
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        spec = SandboxSpec(adapter_socket=str(tmp_path / "a.sock"), adapter_port=taken.getsockname()[1])
        with pytest.raises(SandboxError, match="(?s)forwarder did not start.*address already in use"):
            run(ApptainerSandbox(spec, image).start())
    assert verbs(calls())[-2:] == ["instance stop", "instance list"]
    assert not processes("sleep 864242")


def test_adapter_forwarder_runs_inside_the_instance(fake, image, tmp_path):
    _, calls = fake
    sock = str(tmp_path / "adapter.sock")
    server = UnixHTTPServer(sock, Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go():
        async with ApptainerSandbox(SandboxSpec(adapter_socket=sock, adapter_port=port), image):
            # The fake has no network namespace: the forwarder's port is reachable from here.
            return await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read())
    assert run(go()) == b"adapter says hi"
    server.shutdown()
    start, fwd = calls()[1]["argv"], calls()[3]["argv"]
    assert f"{sock}:/run/agentrl/adapter.sock" in start and f"{FORWARDER_HOST}:/run/agentrl/forwarder.py:ro" in start
    assert fwd[-6:] == ["python3", "/run/agentrl/forwarder.py", "--port", str(port),
                        "--unix", "/run/agentrl/adapter.sock"]
    assert not processes("forwarder.py --port")


def test_argv_builders_follow_the_apptainer_docs():
    """Each flag, as Apptainer's documentation gives it:

    man apptainer-instance-start / cmd/internal/cli/action_flags.go (apptainer/apptainer):
      -C, --containall  "contain not only file systems, but also PID, IPC, and environment"
      -e, --cleanenv    "clean environment before running container"
      -n, --net         "run container in a new network namespace"
      --network         "specify desired network type separated by commas"
      -o, --overlay     "use an overlayFS image for persistent data storage"
      -W, --workdir     "working directory to be used for /tmp, /var/tmp and $HOME (if -c/--contain was also used)"
      -H, --home        "src path or src:dest pair ... dest overrides the home directory within the container"
      -B, --bind        "src[:dest[:opts]] ... 'ro' (read-only) or 'rw' ... Multiple bind paths can be given
                         by a comma separated list"
      --env-file        "pass environment variables from file to contained process"
      --cwd/--pwd       "initial working directory for payload process inside the container" (exec, not start)
      -f, --fakeroot    "run container with the appearance of running as root"
    userdocs networking.rst: "none (must be used alone) ... By default, none is the only network
      configuration that can be used by non-privileged users. It isolates the container network from the
      host network with a loopback interface."; --network "can only be invoked in combination with --net".
    userdocs persistent_overlays.rst: "The --writable-tmpfs size is controlled by sessiondir max size ...
      This defaults to 64MiB"; "$ apptainer overlay create --sparse --size 1024 /tmp/ext3_overlay.img";
      "if Apptainer is installed in setuid mode, you must be root to use a bare directory as an overlay.
      ext3 file system images can be used as overlays without root privileges."
    man apptainer-overlay-create: "-s, --size=64 size of the EXT3 writable overlay in MiB",
      "-S, --sparse create a sparse overlay", "-f, --fakeroot make overlay layout usable by actions run
      with --fakeroot".
    userdocs running_services.rst: "$ apptainer exec instance://instance1 cat /etc/os-release",
      "$ apptainer instance stop instance1".
    instance_stop_linux.go: default signal SIGINT; "-F, --force force kill instance" (SIGKILL);
      "-t, --timeout force kill non stopped instances after X seconds" (default 10).
    instance_linux.go: `instance list --json` prints {"instances": [{"instance", "pid", "img", "ip", ...}]}.
    apptainer-exec(1) / action_flags.go: "--no-privs  drop all privileges from root user in container",
      "--drop-caps  a comma separated capability list to drop", "--security  enable security features
      (SELinux, Apparmor, Seccomp)"; userdocs security_options.rst: "seccomp:<profile>" takes a JSON
      profile in the OCI (Docker) format, where Apptainer was built with seccomp support.
    userdocs environment_and_metadata.rst: --env-file holds NAME=VALUE pairs (MYVAR="Hello from a file");
      --env "Separate multiple variables with commas" (so values with commas go through the file).
    """
    spec = SandboxSpec(workdir="/work", ro_binds={"/opt/tools": "/tools"}, adapter_socket="/run/a.sock")
    paths = InstancePaths("/s/o.img", "/s/work", "/s/home", "/s/tree")
    argv = instance_start_argv("apptainer", spec, "/img/t.sif", "agentrl-x", paths, fakeroot=False)
    assert argv == ["apptainer", "instance", "start", "--containall", "--cleanenv", "--net", "--network", "none",
                    "--no-privs", "--overlay", "/s/o.img", "--workdir", "/s/work", "--home", "/s/home:/home/agent",
                    "--bind", "/s/tree:/work", "--bind", "/opt/tools:/tools:ro",
                    "--bind", "/run/a.sock:/run/agentrl/adapter.sock",
                    "--bind", f"{FORWARDER_HOST}:/run/agentrl/forwarder.py:ro", "/img/t.sif", "agentrl-x"]
    root = instance_start_argv("apptainer", SandboxSpec(), "/i.sif", "n", InstancePaths("o", "w", "h", None),
                               fakeroot=True, seccomp_profile="/s/seccomp.json")
    assert root == ["apptainer", "instance", "start", "--containall", "--cleanenv", "--net", "--network", "none",
                    "--fakeroot", "--drop-caps", ",".join(dropped_capabilities()),
                    "--security", "seccomp:/s/seccomp.json", "--overlay", "o", "--workdir", "w",
                    "--home", "h:/root", "/i.sif", "n"]
    assert overlay_create_argv("apptainer", "/s/o.img", 1024, fakeroot=False) == \
        ["apptainer", "overlay", "create", "--size", "1024", "--sparse", "/s/o.img"]
    assert exec_argv("apptainer", "n", "/w", "/s/env", ["ls"], security=["--no-privs"]) == \
        ["apptainer", "exec", "--cleanenv", "--no-privs", "--env-file", "/s/env", "--pwd", "/w", "instance://n", "ls"]
    assert exec_argv("apptainer", "n", "/work", "/s/env", ["ls", "-l"]) == \
        ["apptainer", "exec", "--cleanenv", "--env-file", "/s/env", "--pwd", "/work", "instance://n", "ls", "-l"]
    assert stop_argv("apptainer", "n") == ["apptainer", "instance", "stop", "--timeout", "10", "n"]
    assert stop_argv("apptainer", "n", force=True) == ["apptainer", "instance", "stop", "--force", "n"]
    assert env_file_text({"A": "x y", "B": "$HOME"}) == "A='x y'\nB='$HOME'\n"
    with pytest.raises(ValueError, match="not a valid shell name"):
        env_file_text({"A-B": "1"})
    with pytest.raises(ValueError, match="cannot express"):
        instance_start_argv("apptainer", SandboxSpec(ro_binds={"/a,b": "/x"}), "i", "n", paths, fakeroot=False)


def test_apptainer_refusals(tmp_path, image, monkeypatch):
    with pytest.raises(ValueError, match="needs an image"):
        ApptainerSandbox(SandboxSpec(), "")
    with pytest.raises(ValueError, match="does not exist"):
        ApptainerSandbox(SandboxSpec(), str(tmp_path / "nope.sif"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxError, match="not installed"):
        run(ApptainerSandbox(SandboxSpec(), image).start())
    with pytest.raises(ValueError, match="user must be"):
        run(ApptainerSandbox(SandboxSpec(), image).exec("true", user="nobody"))


# --- local --------------------------------------------------------------------------------------

def test_local_refuses_without_opt_in():
    with pytest.raises(SandboxError, match="pool.allow_unsafe_local: true"):
        LocalSandbox(SandboxSpec())


def test_local_exec_files_env_and_copy(repo, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")

    async def go():
        async with LocalSandbox(SandboxSpec(workdir_source=str(repo), env={"TASK": "t1"}), allow_unsafe=True) as sb:
            r = await sb.exec("echo $TASK ${SECRET_TOKEN:-none} $USER; python3 app.py; echo x > new.txt")
            root = await sb.exec(["sh", "-c", "echo $USER"], user="root")
            await sb.write_file("/testbed/sub/d.bin", b"\0\1", mode=0o600)
            got = await sb.read_file("/testbed/sub/d.bin")
            sub = await sb.exec("pwd", cwd="/testbed/sub")
            with pytest.raises(SandboxError, match="only paths under /testbed"):
                await sb.read_file("/etc/passwd")
            with pytest.raises(SandboxError, match="only paths under /testbed"):
                await sb.write_file("/testbed/../etc/x", b"")
            with pytest.raises(FileNotFoundError):
                await sb.read_file("/testbed/missing")
            return r, root, got, sub, sb.root
    r, root, got, sub, copy = run(go())
    assert r.stdout.decode().splitlines() == ["t1 none agent", "hello from the sandbox"]
    assert root.stdout == b"root\n" and got == b"\0\1"
    assert sub.stdout.decode().strip() == str(copy / "sub")
    assert sorted(p.name for p in repo.iterdir()) == ["app.py"] and not copy.exists()


def test_local_timeout_kills_the_group():
    async def go():
        async with LocalSandbox(SandboxSpec(), allow_unsafe=True) as sb:
            return await sb.exec("sleep 3081 & sleep 3082 & wait", timeout_s=1)
    r = run(go())
    assert r.timed_out and not processes("sleep 308")


# --- factory ------------------------------------------------------------------------------------

def test_factory(tmp_path, image):
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    assert isinstance(make_sandbox("bwrap", SandboxSpec()), BwrapSandbox)
    assert make_sandbox("bwrap", SandboxSpec(), image=str(rootfs)).spec.rootfs == str(rootfs)
    with pytest.raises(ValueError, match="rootfs directory"):
        make_sandbox("bwrap", SandboxSpec(), image=image)
    sb = make_sandbox("apptainer", SandboxSpec(), image=image, fakeroot=True)
    assert isinstance(sb, ApptainerSandbox) and sb.fakeroot and sb.image == image
    assert make_sandbox("apptainer", SandboxSpec(rootfs=str(rootfs))).image == str(rootfs)
    with pytest.raises(ValueError, match="needs an image"):
        make_sandbox("apptainer", SandboxSpec())
    with pytest.raises(SandboxError, match="allow_unsafe_local"):
        make_sandbox("local", SandboxSpec())
    assert isinstance(make_sandbox("local", SandboxSpec(), allow_unsafe_local=True), LocalSandbox)
    with pytest.raises(ValueError, match="unknown sandbox runtime 'docker': choose one of bwrap, apptainer, local"):
        make_sandbox("docker", SandboxSpec())


def test_scratch_names_carry_their_owner_and_only_dead_owners_are_reaped(tmp_path):
    from hpc.sandbox.scratch import make_scratch, owner_of, reap_abandoned
    mine = make_scratch("bwrap", str(tmp_path))
    assert owner_of(mine.name) == (socket.gethostname(), os.getpid())
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    gone = tmp_path / f"agentrl-layer.{host}.{dead.pid}.x1"
    (gone / "work/work").mkdir(parents=True)
    (gone / "work/work").chmod(0)
    elsewhere = tmp_path / f"agentrl-layer.other-host.{dead.pid}.x2"
    alive = tmp_path / f"agentrl-layer.{host}.1.x3"             # pid 1 is alive
    foreign = tmp_path / "someone-elses-dir"
    for d in (elsewhere, alive, foreign):
        d.mkdir()
    assert reap_abandoned(str(tmp_path)) == [gone]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, elsewhere.name, alive.name, foreign.name])
    assert owner_of("agentrl-layer.a.b.c.12.zz") == ("a.b.c", 12) and owner_of("agentrl-x") is None
