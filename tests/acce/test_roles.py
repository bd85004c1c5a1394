"""Roles (acce/runtime/roles.py) with counting fakes: ticks, drains, gate reports, restarts, typed stats."""
import dataclasses

import pytest

from acce.runtime.queue import RolloutQueue, StalenessGate, SyncGate
from acce.runtime.roles import (Drained, LearnerConsumer, ProducerStats, RolloutProducer, RuntimeStats, Tally,
                                gate_spec, rebase)
from acce.runtime.worker import RolloutWorkerStats


class FakeWorker:
    """Produces `per_tick` segments per collect until `paused`; one episode every second collect."""

    def __init__(self, per_tick=2, worker_id=3):
        self.per_tick, self.worker_id, self.collects, self.paused = per_tick, worker_id, 0, False
        self.stats = RolloutWorkerStats()
        self.pending_episodes = []

    def collect(self, min_segments=1, max_steps=None):
        self.collects += 1
        if self.paused:
            return []
        self.stats = dataclasses.replace(self.stats, env_steps=self.stats.env_steps + 10,
                                         segments=self.stats.segments + self.per_tick)
        if self.collects % 2 == 0:
            self.pending_episodes.append({"success": True, "task_id": 0})
        return [f"seg{self.collects}.{i}" for i in range(self.per_tick)]

    def drain_episodes(self):
        eps, self.pending_episodes = self.pending_episodes, []
        return eps

    @property
    def idle(self):
        return self.paused


class FakeLearner:
    def __init__(self, steps_per_update=2):
        self.version, self.updates, self.steps, self.batches = 0, 0, steps_per_update, []

    def update(self, batch):
        self.batches.append(list(batch))
        self.updates += 1
        self.version += self.steps
        return {"learner/version": float(self.version)}

    def trainable_state(self):
        return {"v": self.version}

    def state_dict(self):
        return {"version": self.version}


class CountingGate:
    def __init__(self):
        self.reports = []

    def consumed(self, updates, version):
        self.reports.append((updates, version))


def test_producer_puts_whole_segments_tags_episodes_and_reports_idle():
    worker, put, seen = FakeWorker(), [], []
    p = RolloutProducer(worker, put.append, on_episode=seen.append)
    assert p.tick() and p.tick()
    assert put == ["seg1.0", "seg1.1", "seg2.0", "seg2.1"]
    eps, stats = p.drain()
    assert eps == seen == [{"success": True, "task_id": 0, "worker_id": 3}]
    assert isinstance(stats, ProducerStats) and stats.env_steps == 20 and stats.segments == 4
    assert stats["env_steps"] == 20 and stats.worker_id == 3  # read by name, as the dicts it replaced were
    assert stats.counters == RolloutWorkerStats(env_steps=20, segments=4)  # the worker's own snapshot, whole
    worker.paused = True
    assert not p.tick()  # nothing to do: the placement backs off
    assert p.drain()[0] == [] and p.state() == {}


def test_learner_consumer_updates_publishes_then_reports_to_the_gate():
    learner, gate, published = FakeLearner(), CountingGate(), []
    learner.updates = 5  # resumed: the gate counts this run's updates only
    queue = RolloutQueue(4)
    take = lambda: queue.get_batch(2) if len(queue) >= 2 else None  # noqa: E731
    c = LearnerConsumer(learner, take, lambda v, s: published.append((v, s)), gate)
    assert not c.tick()  # no batch: nothing happens
    for s in "abc":
        queue.put(s)
    assert c.tick() and not c.tick()
    assert learner.batches == [["a", "b"]] and published == [(2, {"v": 2})] and gate.reports == [(1, 2)]
    ups, stats = c.drain()
    assert ups == [{"learner/version": 2.0}] and stats.version == 2 and stats.updates_done == 1
    assert c.drain()[0] == [] and c.state() == {"version": 2}


def test_the_learner_takes_no_batch_once_train_max_versions_is_reached():
    # a learner that runs ahead of the driver's polls (Ray) must stop at the version budget, not a poll later
    learner, gate, published, taken = FakeLearner(steps_per_update=1), CountingGate(), [], []
    take = lambda: taken.append(1) or ["x", "y"]  # noqa: E731  (a batch is always ready)
    c = LearnerConsumer(learner, take, lambda v, s: published.append(v), gate, max_version=3)
    ticks = [c.tick() for _ in range(6)]
    assert learner.version == 3 and ticks == [True, True, True, False, False, False]
    assert len(taken) == 3 and published == [1, 2, 3]  # no batch taken (and lost) past the budget
    # versions count optimizer steps: an update of 2 steps may pass the cap by at most one update
    two = LearnerConsumer(FakeLearner(steps_per_update=2), take, lambda v, s: None, CountingGate(), max_version=3)
    assert [two.tick() for _ in range(4)] == [True, True, False, False] and two.version == 4
    uncapped = LearnerConsumer(FakeLearner(steps_per_update=1), take, lambda v, s: None, CountingGate())
    assert all(uncapped.tick() for _ in range(6)) and uncapped.version == 6  # 0 = no cap


def test_sync_gate_admits_one_versions_batch_in_rounds_and_the_report_opens_the_next():
    gate = SyncGate(segments_per_round=2, segments_per_version=5, start_version=0)
    # round 1: one per env; env (0, 0) asks again before env (0, 1) had its turn: denied
    assert gate.try_acquire(0, 0, 0) and not gate.try_acquire(0, 0, 0) and gate.try_acquire(0, 1, 0)
    # rounds 2 and 3 (the last one partial: 5 segments per version)
    assert gate.try_acquire(0, 1, 0) and gate.try_acquire(0, 0, 0) and gate.try_acquire(0, 0, 0)
    assert not gate.try_acquire(0, 1, 0) and gate.admitted_this_version == 5
    gate.consumed(1, 4)  # the learner's report after its update: the next version's first round
    assert not gate.try_acquire(0, 1, 0) and gate.try_acquire(0, 1, 4)
    # a dead worker's undelivered admission goes back: the batch can still fill
    assert gate.release_worker(0) == 1 and gate.admitted_this_version == 0 and gate.try_acquire(0, 1, 4)


@pytest.mark.parametrize("mode, cls", [("sync", SyncGate), ("async", StalenessGate)])
def test_the_mode_is_a_choice_of_gate(mode, cls):
    from acce.config import load
    cfg = load(None, [f"runtime.mode={mode}", "learner.batch_segments=6", "learner.max_staleness=0"])
    gcls, args = gate_spec(cfg, total_envs=4, start_version=7)
    gate = gcls(*args)
    assert isinstance(gate, cls) and hasattr(gate, "consumed") and hasattr(gate, "release_worker")
    assert not gate.try_acquire(0, 0, 6) and gate.try_acquire(0, 0, 7)  # counts from the start version


def test_rebase_keeps_totals_across_restarts_and_counts_new_processes():
    t, restarted = rebase(None, pid=10, count=0)
    assert t == Tally(10, 0) and not restarted
    t, restarted = rebase(t, 10, 50)
    assert t.total == 50 and not restarted
    t, restarted = rebase(t, 11, 7)  # a new process counts from zero again: the dead one's 50 move into base
    assert (t.base, t.count, t.total, restarted) == (50, 7, 57, True)
    t, restarted = rebase(t, 11, 9)
    assert t.total == 59 and not restarted


def test_typed_stats_read_like_the_dicts_they_replaced():
    s = RuntimeStats(env_steps=5, learner_version=2, server_version=1, queue_size=0, queue_capacity=4)
    assert s["env_steps"] == 5 and s.get("restarts", 9) == 0 and "imagined_steps" not in s
    assert s.get("imagined_steps", 0) == 0
    with pytest.raises(KeyError):
        s["nope"]
    out = Drained(updates=({"a": 1.0},))
    ups = []
    ups += out["updates"]
    assert ups == [{"a": 1.0}] and out.episodes == ()


class FakeWMTrainer:
    """Counts: episodes added, optimizer steps taken; its version is the steps taken."""

    def __init__(self):
        self.version, self.buffer = 0, []
        self.model = type("M", (), {"describe": lambda self: {"fake": True}, "stats_ready": True})()

    def add_episodes(self, episodes):
        self.buffer += episodes
        return len(episodes)

    def train_steps(self, n):
        self.version += n
        return {"wm/loss/total": 1.0}

    def publish(self):
        return self.version, {"w": self.version}


def test_world_model_trainer_role_ticks_take_train_publish():
    from types import SimpleNamespace

    from acce.runtime.imagination import WMTrainerRole
    icfg = SimpleNamespace(start_episodes_per_publish=2, wm_min_episodes=1, wm_steps_per_publish=3, wm_train_ratio=0)
    inbox, published = [], []
    take = lambda: [inbox.pop() for _ in range(len(inbox))]  # noqa: E731
    role = WMTrainerRole(lambda first: FakeWMTrainer(), icfg, take=take, publish=published.append)
    assert not role.tick() and published == []  # nothing recorded yet: idle
    inbox.append(SimpleNamespace(source="sim", num_steps=5, episode_id="e0"))
    assert role.tick() and [p["version"] for p in published] == [3]  # trained 3 steps, first publication
    assert role.tick() and [p["version"] for p in published] == [3, 6]  # unlimited ratio: 3 more, due again
    assert published[0]["episodes"][0].episode_id == "e0" and published[0]["desc"] == {"fake": True}
    m = role.drain()
    assert m["wm/version"] == 6.0 and m["wm/publishes"] == 2.0 and m["wm/real_episodes"] == 1.0
    assert role.state() == {}


def test_every_role_meets_the_protocol():
    from types import SimpleNamespace

    from acce.runtime.eval_role import EvaluatorRole
    from acce.runtime.imagination import WMTrainerRole
    from acce.runtime.roles import Role
    icfg = SimpleNamespace(start_episodes_per_publish=1)
    roles = [RolloutProducer(FakeWorker(), [].append), LearnerConsumer(FakeLearner(), lambda: None, print, None),
             WMTrainerRole(lambda first: None, icfg), EvaluatorRole(lambda state, version, split: None)]
    assert all(isinstance(r, Role) for r in roles)
