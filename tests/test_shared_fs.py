"""The file contracts across two clients of a real network filesystem (GlusterFS through FUSE, each
mount a node's client with caches of its own): writers on one mount, readers on the other.

docs/architecture.md, "The shared filesystem", says what each contract needs of the filesystem."""

import errno
import hashlib
import json
import multiprocessing
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from test_ledger_faults import kill_9_run

from agentrl.sample import SAMPLE_CODEC, Sample
from hpc.buffer import read_shard, write_shard
from hpc.ledger import Claim, Ledger
from hpc.localcluster import glusterfs
from hpc.registry import Registry

pytest_plugins = ["glusterfs_volume"]
pytestmark = pytest.mark.integration


def test_two_mounts_are_two_clients_of_one_volume_and_link_is_exclusive_across_them(gluster, tmp_path):
    a, b = gluster.clients
    assert os.stat(a).st_dev != os.stat(b).st_dev                   # two mounts, one volume
    with open(f"{a}/written-on-a", "w") as f:
        f.write("from a")
    assert open(f"{b}/written-on-a").read() == "from a"
    for side in (a, b):
        open(f"{side}/tmp-{os.path.basename(side)}", "w").close()
    os.link(f"{a}/tmp-{os.path.basename(a)}", f"{a}/claimed")
    with pytest.raises(FileExistsError):
        os.link(f"{b}/tmp-{os.path.basename(b)}", f"{b}/claimed")   # the other client loses, whatever its caches
    assert os.stat(f"{b}/claimed").st_ino == os.stat(f"{b}/tmp-{os.path.basename(a)}").st_ino


def test_up_and_down_leave_nothing_mounted_or_running(gluster, tmp_path):
    """(`gluster`: GlusterFS can run here, or under CI the test fails saying why.)"""
    vol = glusterfs.up(tmp_path / "v", clients=2, cache_s=3)
    assert all(os.path.ismount(c) for c in vol.clients) and all(vol.client_pids)
    with pytest.raises(glusterfs.GlusterError, match="holds a volume already"):
        glusterfs.up(tmp_path / "v")
    glusterfs.down(tmp_path / "v")
    assert not any(os.path.ismount(c) for c in vol.clients)
    assert vol.name not in subprocess.run(["pgrep", "-a", "-f", "gluster"], capture_output=True, text=True).stdout
    assert not (tmp_path / "v" / glusterfs.STATE).exists()
    glusterfs.down(tmp_path / "v")                                  # twice: nothing to do


def test_up_over_the_dead_mounts_of_clients_killed_with_9_mounts_again(gluster, tmp_path):
    """A client killed (or its run's namespace kept by the next run) leaves a mount point that answers
    ENOTCONN: neither down nor up may take it for a plain directory (CI: up failed with 'File exists')."""
    vol = glusterfs.up(tmp_path / "v", clients=2)
    for pid in vol.client_pids:
        os.kill(pid, 9)
    deadline = time.monotonic() + 10              # until the kernel's cached attributes of the mount expire
    while os.path.exists(vol.clients[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(OSError) as dead:
        os.stat(vol.clients[0])
    assert dead.value.errno == errno.ENOTCONN and not os.path.ismount(vol.clients[0])
    assert glusterfs.mounted(vol.clients[0])
    (tmp_path / "v" / glusterfs.STATE).unlink()                   # the record lost too: up alone must cope
    try:
        again = glusterfs.up(tmp_path / "v", clients=2)
        assert all(os.path.ismount(c) for c in again.clients)
        open(f"{again.clients[0]}/after", "w").close()
        assert os.path.exists(f"{again.clients[1]}/after")
    finally:
        glusterfs.down(tmp_path / "v")
        for args in (("volume", "stop", vol.name, "force"), ("volume", "delete", vol.name)):  # the first's
            subprocess.run(["gluster", "--mode=script", *args], capture_output=True, timeout=60)
    assert not any(glusterfs.mounted(c) for c in vol.clients)


@pytest.mark.parametrize("caches", ["gluster", "gluster_nfs_caches"])
def test_the_ledger_under_kill_9_of_workers_on_both_clients(caches, request):
    """The aimed and random kills of test_ledger_faults, the workers alternating between the two mounts:
    no attempt lost, none committed twice, each commit's shard whole and of its own try. Both cache
    settings outlast the lease (0.5 s): GlusterFS's 1 s, and 3 s attribute, entry and negative caches."""
    vol = request.getfixturevalue(caches)
    roots = [f"{c}/faults" for c in vol.clients]
    os.makedirs(roots[0])
    kill_9_run(roots, random_kills=20, deadline_s=180)


def _open_once(root: str, queue) -> None:
    queue.put(Ledger(f"{root}/ledger").open_once(0, list(range(4)), 2, payload={"by": root}).generation)


def test_open_once_from_both_clients_opens_one_generation(gluster):
    roots = [f"{c}/once" for c in gluster.clients]
    os.makedirs(roots[0])
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_open_once, args=(roots[i % 2], queue)) for i in range(6)]
    for p in procs:
        p.start()
    gens = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    assert len(set(gens)) == 1
    for root in roots:      # each client sees the one generation, opened by one of them
        assert sorted(os.listdir(f"{root}/ledger/rollouts/0")) == [f"g{gens[0]}", "opening-0"]
        assert Ledger(f"{root}/ledger").spec(0, gens[0]).payload["by"] in roots


def _write_shards(root: str, n: int) -> None:
    for g in range(n):
        size = 50_000 + 1000 * g      # large enough for several FUSE writes each
        sample = Sample(tokens=np.arange(size + 2), response_length=size, loss_mask=np.ones(size),
                        rollout_log_probs=np.full(size, -0.5), reward=float(g), status="completed",
                        group_index=g, attempt=0)
        write_shard(f"{root}/buffer", Claim(0, g, 0, 0, 0), [sample], SAMPLE_CODEC)


@pytest.mark.parametrize("caches", ["gluster", "gluster_nfs_caches"])
def test_a_shard_written_on_one_client_is_read_whole_or_not_at_all_on_the_other(caches, request):
    """Written on one mount while the other polls for it: never torn, whatever the caches."""
    vol = request.getfixturevalue(caches)
    writer_root, reader_root = (f"{c}/shards" for c in vol.clients)
    os.makedirs(writer_root)
    n = 12
    writer = multiprocessing.get_context("fork").Process(target=_write_shards, args=(writer_root, n))
    writer.start()
    seen, deadline = {}, time.monotonic() + 120
    from hpc.buffer import shard_path
    while len(seen) < n:
        assert writer.exitcode in (None, 0), f"the writer exited {writer.exitcode} after {len(seen)} shards were seen"
        assert time.monotonic() < deadline, (f"only {sorted(seen)} of {n} shards seen on the reader's client (the "
                                             f"writer: {'running' if writer.exitcode is None else 'done'})")
        for g in range(n):
            if g in seen:
                continue
            path = shard_path(f"{reader_root}/buffer", Claim(0, g, 0, 0, 0))
            try:
                header, [sample] = read_shard(path, SAMPLE_CODEC)
            except OSError as e:
                assert e.errno == errno.ENOENT, e
                continue
            except Exception as e:  # noqa: BLE001 - a torn shard would fail here
                if "does not exist" in str(e):
                    continue
                raise
            assert header["group"] == g and sample.response_length == 50_000 + 1000 * g and sample.reward == g
            seen[g] = time.monotonic()
        time.sleep(0.01)
    writer.join(60)
    assert writer.exitcode == 0


def skew_run(roots: list[str], offset_s: float, workers: int = 4) -> dict:
    """Workers alternating between the clients, the second client's clock `offset_s` off: the ledger's
    outcome and how much work was done twice."""
    from test_ledger_faults import ATTEMPTS, GROUPS, SEED, worker
    os.makedirs(f"{roots[0]}/log")
    os.makedirs(f"{roots[0]}/at")
    led = Ledger(f"{roots[0]}/ledger")
    led.open_rollout(0, list(range(GROUPS)), ATTEMPTS, max_tries=1000)
    ctx = multiprocessing.get_context("fork")
    until = time.time() + 120
    procs = [ctx.Process(target=worker, args=(roots[i % 2], f"w{i}", f"{SEED}/skew{i}", None,
                                              offset_s if i % 2 else 0.0, until), daemon=True)
             for i in range(workers)]
    for p in procs:
        p.start()
    def made() -> dict:
        """Each attempt's commits as the workers logged them (a worker logs just after its commit)."""
        counts: dict = {}
        for name in os.listdir(f"{roots[0]}/log"):
            for line in open(f"{roots[0]}/log/{name}"):
                if line.endswith("\n"):
                    rec = json.loads(line)
                    counts[tuple(rec["key"])] = counts.get(tuple(rec["key"]), 0) + rec["made"]
        return counts
    try:
        while led.status(0).committed < GROUPS * ATTEMPTS:
            assert time.time() < until, f"not every attempt was committed: {led.status(0)}"
            time.sleep(0.05)
        # the last commit's line may not be written yet (a loaded machine): the workers stop once it is
        while sum(made().values()) < GROUPS * ATTEMPTS and time.time() < until:
            time.sleep(0.05)
    finally:
        for p in procs:
            p.kill()
            p.join()
    tries = len(os.listdir(led.root / "rollouts/0/g1/claims"))
    return {"commits": led.commits(0), "made": made(), "duplicated": tries - GROUPS * ATTEMPTS,
            "attempts": GROUPS * ATTEMPTS}


@pytest.mark.parametrize("leases", [0.5, -0.5, 2.0, -2.0])
def test_a_node_whose_clock_is_off_duplicates_work_but_never_a_commit(gluster, leases, request):
    """One client's clock half a lease or two leases off the other's (the ledger's clock, injected): every
    attempt committed once, its shard of the try that won; what is done twice is counted, for the docs."""
    from test_ledger_faults import ATTEMPTS, GROUPS, LEASE_S
    roots = [f"{c}/skew-{request.node.callspec.id}" for c in gluster.clients]
    os.makedirs(roots[0])
    got = skew_run(roots, leases * LEASE_S)
    assert sorted(got["commits"]) == [(g, a) for g in range(GROUPS) for a in range(ATTEMPTS)]
    assert max(got["made"].values()) == 1 and sum(got["made"].values()) == GROUPS * ATTEMPTS
    for (g, a), rec in got["commits"].items():
        header, _ = read_shard(f"{roots[0]}/buffer/{rec.ref}", SAMPLE_CODEC)
        assert (header["group"], header["attempt"], header["try_index"]) == (g, a, rec.try_index)
    # The fast node takes over the slow one's live claims only once no attempt is left unclaimed: at the tail
    print(f"clock off by {leases:+g} leases: {got['duplicated']} of {got['attempts']} attempts run again")


def test_a_run_directory_on_a_filesystem_that_lacks_what_its_files_need_is_refused(gluster, tmp_path, monkeypatch):
    """On the volume a run directory is made; where link(2) replaces, or mtimes are not kept (test doubles at
    the system calls: this machine has no such filesystem), it is refused, saying what and how to fix it."""
    from hpc.runlayout import RunDirError, RunLayout
    assert RunLayout.create(f"{gluster.clients[0]}/run").manifest().run_id
    real_link, real_utime = os.link, os.utime

    def replacing_link(src, dst, **kw):     # a filesystem without hard links
        raise OSError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(os, "link", replacing_link)
    with pytest.raises(RunDirError, match=r"link\(2\) does not create files exclusively here \(Operation not "
                                          r"permitted\).*NFSv3\+, Lustre"):
        RunLayout.create(tmp_path / "no-links")
    monkeypatch.setattr(os, "link", real_link)
    monkeypatch.setattr(os, "utime", lambda path, times=None, **kw: real_utime(path))   # times ignored
    with pytest.raises(RunDirError, match="reads back as .*the ledger keeps lease deadlines in mtimes"):
        RunLayout.create(tmp_path / "no-mtimes")
    assert not (tmp_path / "no-mtimes" / "run.yaml").exists()


def _heartbeat(services: str, every_s: float) -> None:
    reg = Registry(services)
    rec = reg.register("inference", 0, host="node-a", port=30000)
    while True:
        rec = reg.heartbeat(rec)
        time.sleep(every_s)


@pytest.mark.parametrize("caches", ["gluster", "gluster_nfs_caches"])
def test_a_service_heartbeating_on_one_client_is_alive_on_the_other_and_dead_within_its_ttl_of_kill_9(
        caches, request):
    """The registry's liveness across nodes: a heartbeat replaces the record (rename) every 10 ms on one
    client while the other reads it, which on a FUSE or NFS client meets the replaced record's name
    still cached (ESTALE, or ENOENT) within seconds (hpc.fsio.read_bytes). A record the reader cannot
    open stands in as last read (hpc.registry), so the
    bound is the entry cache's timeout: with a ttl above it plus the heartbeat's interval the service
    never looks dead while it lives. Killed with -9 (no deregister), it is dead to the other client
    within ttl + the heartbeat's interval + one poll."""
    vol = request.getfixturevalue(caches)
    beat_s, poll_s = 0.01, 0.01
    ttl_s = (vol.cache_s or 1.0) + 0.5
    a, b = (f"{c}/services-{caches}" for c in vol.clients)
    os.makedirs(a)
    writer = multiprocessing.get_context("fork").Process(target=_heartbeat, args=(a, beat_s), daemon=True)
    writer.start()
    reader = Registry(b)
    try:
        deadline = time.time() + 30
        while not reader.services():
            assert time.time() < deadline, "the other client never saw the registration"
            time.sleep(poll_s)
        ages, seen, until = [], 0.0, time.time() + 2.0
        while time.time() < until:
            [rec] = reader.alive("inference", ttl_s)        # every read, live: none missed, none raised
            ages.append(time.time() - rec.heartbeat)
            seen = max(seen, rec.heartbeat)
            time.sleep(poll_s)
    finally:
        writer.kill()
        writer.join()
    killed = time.time()
    # Event order, not wall-clock slack (a loaded machine delays any poll): the poll before the first that
    # finds it dead still found it alive, so it died at the first poll past its ttl, whenever that ran.
    alive_at = None                     # when the last poll that found it alive began
    while True:
        began = time.time()
        if not reader.alive("inference", ttl_s):
            break
        alive_at = began
        assert began < killed + 10, "a service killed with -9 still looks alive 10 s later"
        time.sleep(poll_s)
    dead = time.time()
    [last] = reader.services()          # a kill -9 leaves the record: its heartbeat says when it died
    assert seen <= last.heartbeat <= killed
    assert ttl_s <= dead - last.heartbeat
    assert alive_at is None or alive_at - last.heartbeat < ttl_s, "found dead a poll after its ttl ran out"
    print(f"{caches}: {len(ages)} reads while alive, heartbeat age p50 {sorted(ages)[len(ages) // 2]:.3f} s, "
          f"max {max(ages):.3f} s; dead {dead - killed:.2f} s after the kill "
          f"({dead - last.heartbeat:.2f} s after the last heartbeat, ttl {ttl_s:g} s)")


def _blob(n: int, name: str) -> bytes:
    return np.random.default_rng([n, sum(name.encode())]).bytes(96 * 1024)


def _digest(path) -> str:
    h = hashlib.sha256()
    for dirpath, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for name in sorted(files):
            h.update(name.encode() + open(os.path.join(dirpath, name), "rb").read())
    return h.hexdigest()


class _SlowPolicy:
    """A checkpoint written slowly, in many files whose bytes follow from (iteration, name)."""
    files = ["config.json", *(f"model-{i:02d}.safetensors" for i in range(12))]

    def __init__(self, n: int, started=None):
        self.n, self.started = n, started

    def save(self, path) -> None:
        (path / "model.pt").write_bytes(_blob(self.n, "model.pt"))

    def export_hf(self, path) -> None:
        for name in self.files:             # config.json first: what the watcher looks for
            (path / name).write_bytes(_blob(self.n, name))
            if self.started is not None:
                self.started.set()
            time.sleep(0.01)

    def load(self, path) -> None:
        self.loaded = (path / "model.pt").read_bytes()

    @classmethod
    def expected(cls, n: int) -> str:
        h = hashlib.sha256()
        for name in sorted(cls.files):
            h.update(name.encode() + _blob(n, name))
        return h.hexdigest()


def _train(root: str, committed, started) -> None:
    """A trainer on one client: checkpoints 1..3 saved, latest and the published weights moved, then
    killed (by the test) in the middle of the 4th."""
    from agentrl.train.checkpoint import TrainerState, save_checkpoint
    from hpc.runlayout import RunLayout
    run = RunLayout(Path(root))
    for n in (1, 2, 3, 4):
        state = TrainerState(iteration=n, optimizer_steps=n, weight_version=n, prompt_source={})
        save_checkpoint(run, _SlowPolicy(n, started if n == 4 else None), state)
        run.publish_weights(n, run.checkpoint_dir(n) / "hf")
        committed.put((n, time.time()))


def _resume(root: str, queue) -> None:
    from agentrl.train.checkpoint import load_latest
    from hpc.runlayout import RunLayout
    policy = _SlowPolicy(0)
    state = load_latest(RunLayout(Path(root)), policy)
    queue.put((state.iteration, policy.loaded == _blob(state.iteration, "model.pt")))


def test_a_checkpoint_announced_on_one_client_is_whole_when_the_watcher_and_a_resumed_trainer_on_the_other_read_it(
        gluster_nfs_caches, monkeypatch):
    """Checkpoints written slowly on one client (a file every 10 ms) while the eval watcher polls the other
    every 20 ms: each it scores is whole (by hash), though the watcher lists the directory through
    3 s caches. The trainer is killed with -9 in the middle of its 4th checkpoint: the other client's
    watcher never scores it, and a trainer resumed there resumes from the 3rd, whole; the published
    weights it names are whole too."""
    import asyncio

    import agentrl.train.checkpoint  # noqa: F401 - torch, imported once here rather than in each fork
    from agentrl.eval import watch as watcher
    from agentrl.eval.config import EvalConfig
    from hpc.runlayout import RunLayout
    a, b = (f"{c}/run" for c in gluster_nfs_caches.clients)
    RunLayout.create(a)
    run = RunLayout(Path(b))
    ctx = multiprocessing.get_context("fork")
    committed, started = ctx.Queue(), ctx.Event()
    trainer = ctx.Process(target=_train, args=(a, committed, started), daemon=True)
    scored: dict[int, tuple[bool, float]] = {}

    class Eval:                  # what the watcher loads: its digest, in place of scoring it
        def __init__(self, out, cfg, tasks, n):
            self.out, self.n = out, n

        async def run(self, model_dir):
            scored[self.n] = (_digest(model_dir) == _SlowPolicy.expected(self.n), time.time())
            self.out.mkdir(parents=True)
            (self.out / "summary.json").write_text("{}")
            return {"pass@1": 0.0, "k": 1, "pass@k": 0.0}
    monkeypatch.setattr(watcher, "CheckpointEval", Eval)

    def killed_in_the_4th(_run) -> bool:
        if started.is_set() and trainer.exitcode is None:
            trainer.kill()
            trainer.join()
        return trainer.exitcode is not None and len(scored) >= 3
    trainer.start()
    try:
        asyncio.run(asyncio.wait_for(watcher.watch(run, EvalConfig(tasks="unused", poll_s=0.02), [],
                                                   stop=asyncio.Event(), until=killed_in_the_4th), 60))
    finally:
        trainer.kill()
    at = dict(committed.get(timeout=5) for _ in range(3))
    assert committed.empty()                                    # the 4th never committed
    assert sorted(scored) == [1, 2, 3] and all(whole for whole, _ in scored.values())
    assert watcher.complete_checkpoints(run) == [1, 2, 3]      # the 4th's temp directory is no checkpoint
    queue = ctx.Queue()
    ctx.Process(target=_resume, args=(b, queue)).start()
    assert queue.get(timeout=30) == (3, True)
    version, weights = run.published_weights()
    assert version == 3 and _digest(str(weights).replace(a, b)) == _SlowPolicy.expected(3)
    lag = [round(scored[n][1] - at[n], 2) for n in (1, 2, 3)]
    print(f"checkpoints scored on the other client {lag} s after their rename (watcher polling every 0.02 s)")
