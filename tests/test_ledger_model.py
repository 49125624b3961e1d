"""Model-based test: random sequences of ledger operations against a plain model of the rules.

Each worker has its own Ledger object, as each pool worker has: what one worker remembers of a rollout
(hpc.ledger_state's Fresh and Unfinished) goes stale while the others claim, fail and commit. A rollout
here has at most SAMPLE attempts, so a claim reads every lease it needs and must match the model exactly;
beyond that it reads SAMPLE per call (tests/test_ledger.py tests expiry at scale).
"""

from dataclasses import dataclass, field

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hpc.ledger import LeaseLost, Ledger, StaleGeneration
from hpc.ledger_state import SAMPLE

WORKERS = ["w0", "w1", "w2"]


@dataclass
class Attempt:
    tries: list = field(default_factory=list)   # [worker, deadline, failed]
    commit: tuple | None = None                 # (try, worker)


@dataclass
class Rollout:
    gen: int
    groups: list
    attempts: int
    max_tries: int
    closed: bool = False
    state: dict = field(default_factory=dict)

    def __post_init__(self):
        self.state = {(g, a): Attempt() for g in self.groups for a in range(self.attempts)}


def model_state(r: Rollout, key, now):
    at = r.state[key]
    if at.commit is not None:
        return "committed", None
    if not at.tries:
        return "pending", 0
    t = len(at.tries) - 1
    _, deadline, failed = at.tries[t]
    if not failed and deadline > now:
        return "claimed", t
    return ("pending", t + 1) if t + 1 < r.max_tries else ("failed", None)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        import tempfile
        self.dir = tempfile.mkdtemp()
        self.now = 1000.0
        self.leds = {w: Ledger(self.dir, clock=lambda: self.now, seed=i) for i, w in enumerate(WORKERS)}
        self.led = self.leds[WORKERS[0]]
        self.rollouts: dict[int, Rollout] = {}
        self.held = []
        self.last_gen = 0

    @initialize()
    def start(self):
        pass

    @rule(rid=st.integers(0, 2), ngroups=st.integers(1, 3), attempts=st.integers(1, 2),
          max_tries=st.integers(1, 3))
    def open_rollout(self, rid, ngroups, attempts, max_tries):
        groups = list(range(10, 10 + ngroups))
        assert ngroups * attempts <= SAMPLE
        gen = self.led.open_rollout(rid, groups, attempts, max_tries)
        assert gen > self.last_gen
        self.last_gen = gen
        self.rollouts[rid] = Rollout(gen, groups, attempts, max_tries)

    @rule(worker=st.sampled_from(WORKERS), lease=st.sampled_from([5.0, 20.0]))
    def claim(self, worker, lease):
        c = self.leds[worker].claim(worker, lease_s=lease)
        expected = {}
        for rid in sorted(self.rollouts):
            r = self.rollouts[rid]
            if r.closed:
                continue
            for key in r.state:
                s, t = model_state(r, key, self.now)
                if s == "pending":
                    expected.setdefault(rid, {})[key] = t
        if c is None:
            assert not expected, f"claim returned None but {expected} are claimable"
            return
        assert c.rollout_id == min(expected), "the oldest open rollout is served first"
        assert expected[c.rollout_id].get((c.group, c.attempt)) == c.try_index
        r = self.rollouts[c.rollout_id]
        assert c.generation == r.gen
        r.state[(c.group, c.attempt)].tries.append([worker, self.now + lease, False])
        self.held.append(c)

    def _current(self, c):
        r = self.rollouts.get(c.rollout_id)
        return r if r is not None and r.gen == c.generation else None

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def commit(self, i):
        c = self.held[i % len(self.held)]
        r = self._current(c)
        if r is None:
            try:
                self.led.commit(c, "x")
            except StaleGeneration:
                return
            raise AssertionError("commit of a superseded generation was accepted")
        at = r.state[(c.group, c.attempt)]
        made = self.led.commit(c, f"ref-{c.try_index}")
        if at.commit is None:
            at.commit = (c.try_index, c.worker_id)
        assert made == (at.commit == (c.try_index, c.worker_id))

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def fail(self, i):
        c = self.held[i % len(self.held)]
        self.led.fail(c, "infra")
        r = self._current(c)
        if r is not None:
            r.state[(c.group, c.attempt)].tries[c.try_index][2] = True

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def heartbeat(self, i):
        c = self.held[i % len(self.held)]
        r = self._current(c)
        try:
            self.led.heartbeat(c)
        except LeaseLost:
            assert r is not None
            tries = r.state[(c.group, c.attempt)].tries
            _, deadline, failed = tries[c.try_index]
            assert failed or deadline <= self.now or len(tries) > c.try_index + 1
            return
        except StaleGeneration:
            assert r is None
            return
        assert r is not None
        tries = r.state[(c.group, c.attempt)].tries
        assert len(tries) == c.try_index + 1 and not tries[c.try_index][2]
        assert tries[c.try_index][1] > self.now, "an expired lease was renewed"
        tries[c.try_index][1] = self.now + c.lease_s

    @rule(dt=st.sampled_from([1.0, 4.0, 6.0, 15.0]))
    def tick(self, dt):
        self.now += dt

    @precondition(lambda self: self.rollouts)
    @rule(rid=st.integers(0, 2))
    def close(self, rid):
        if rid in self.rollouts:
            self.led.close_rollout(rid)
            self.rollouts[rid].closed = True

    @invariant()
    def status_matches_model(self):
        for rid, r in self.rollouts.items():
            st_ = self.led.status(rid)
            counts = {"pending": 0, "claimed": 0, "committed": 0, "failed": 0}
            for key in r.state:
                counts[model_state(r, key, self.now)[0]] += 1
            got = {"pending": st_.pending, "claimed": st_.claimed, "committed": st_.committed,
                   "failed": st_.failed}
            assert got == counts, (rid, got, counts)
            complete = sorted(g for g in r.groups
                              if all(r.state[(g, a)].commit for a in range(r.attempts)))
            assert st_.complete_groups == complete == self.led.complete_groups(rid)   # the trainer's cheap poll
            assert st_.closed == r.closed and st_.generation == r.gen
            for (g, a), rec in self.led.commits(rid).items():
                assert (rec.try_index, rec.worker_id) == r.state[(g, a)].commit


LedgerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
test_ledger_matches_model = LedgerMachine.TestCase
