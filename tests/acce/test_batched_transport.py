"""Segments and gate admissions move in batches on Ray: a worker asks the gate once for all its waiting envs, a
producer puts a tick's segments in one call when the queue has room, and the learner takes a batch in a few calls.
Each batched path gives the same answers, in the same order, as the one-at-a-time calls it replaces."""
import queue as queue_mod

import numpy as np
import pytest

from acce.runtime.queue import StalenessGate, SyncGate, put_all_until_stopped
from acce.runtime.roles import RolloutProducer
from acce.runtime.worker import RolloutWorker
from sim.vector_env import SimVectorEnv
from test_worker import CountingPolicy


# --- gates -----------------------------------------------------------------------------------------------------------
def _script():
    """(worker, envs, version) asks that cross a staleness bound, a round boundary and a version change."""
    return [(0, [0, 1, 2], 0), (1, [0, 1], 0), (0, [0, 1, 2], 0), (1, [1, 0], 3), (1, [1, 2], 3), (0, [2], 0),
            (2, [0, 1, 2, 3], 3)]


@pytest.mark.parametrize("make", [lambda: StalenessGate(batch_segments=4, steps_per_batch=3, max_staleness=3),
                                  lambda: SyncGate(segments_per_round=5, segments_per_version=8)],
                         ids=["staleness", "sync"])
def test_try_acquire_many_answers_as_the_calls_one_after_another(make):
    one, many = make(), make()
    expected, got = [], []
    for k, (worker, envs, version) in enumerate(_script()):
        expected += [one.try_acquire(worker, e, version) for e in envs]
        got += many.try_acquire_many(worker, envs, version)
        if k == 2:  # the learner reports an update in between
            one.consumed(1, 3)
            many.consumed(1, 3)
    assert got == expected
    assert True in got and False in got  # the script exercises both answers
    assert (many.denied, many.released) == (one.denied, one.released)


class BatchGate:
    """Admits envs in the order asked until `budget` admissions; counts calls of each kind."""

    def __init__(self, budget):
        self.budget, self.calls, self.single_calls, self.asked = budget, 0, 0, []

    def try_acquire(self, worker_id, env_index, version):
        self.single_calls += 1
        return False

    def try_acquire_many(self, worker_id, env_indices, version):
        self.calls += 1
        self.asked.append(list(env_indices))
        out = []
        for _ in env_indices:
            out.append(self.budget > 0)
            self.budget -= 1
        return out


def test_a_worker_asks_the_gate_once_for_all_its_waiting_envs_in_env_order():
    gate = BatchGate(budget=3)
    worker = RolloutWorker(SimVectorEnv(["reach"], 5, image_size=32), CountingPolicy(), segment_len=2, chunk_len=4,
                           exec_horizon=4, gate=gate)
    try:
        worker.env.reset()
        worker._decide([])
        assert (gate.calls, gate.single_calls, gate.asked) == (1, 0, [[0, 1, 2, 3, 4]])
        assert worker.stats.gate_asks == 5
        # the first three asked were admitted: they hold tickets and are sampled; the other two wait, paused
        assert worker.ticket.tolist() == [True, True, True, False, False]
        assert worker.paused.tolist() == [False, False, False, True, True]
        assert worker.stats.decisions == 3
    finally:
        worker.close()


# --- producer puts ---------------------------------------------------------------------------------------------------
class FakeRayQueue:
    """ray.util.queue.Queue's put / put_nowait_batch semantics (all or nothing; Full when it would overflow)."""

    def __init__(self, maxsize, drain_on_wait=0):
        self.maxsize, self.items, self.batch_calls, self.put_calls = maxsize, [], 0, 0
        self.drain_on_wait = drain_on_wait
        """items a consumer takes each time a put finds the queue full"""

    def put_nowait_batch(self, items):
        self.batch_calls += 1
        if len(self.items) + len(items) > self.maxsize:
            raise queue_mod.Full
        self.items += items

    def put(self, item, timeout=None):
        self.put_calls += 1
        if len(self.items) >= self.maxsize:
            del self.items[:self.drain_on_wait]
            raise queue_mod.Full
        self.items.append(item)


def test_put_all_is_one_call_when_there_is_room():
    q = FakeRayQueue(maxsize=10)
    assert put_all_until_stopped(q, [1, 2, 3], lambda: False, timeout_s=5)
    assert (q.items, q.batch_calls, q.put_calls) == ([1, 2, 3], 1, 0)


def test_put_all_waits_item_by_item_when_the_batch_does_not_fit_and_keeps_the_order():
    q = FakeRayQueue(maxsize=4, drain_on_wait=1)
    q.items = ["a", "b", "c"]
    assert put_all_until_stopped(q, [1, 2, 3], lambda: False, timeout_s=5, poll_s=0.01)
    assert q.batch_calls == 1 and q.put_calls > 3  # refused whole, then paced one at a time
    assert q.items[-3:] == [1, 2, 3]


def test_put_all_stops_without_delivering_the_rest():
    q = FakeRayQueue(maxsize=2)
    q.items = ["a", "b"]
    assert not put_all_until_stopped(q, [1, 2], lambda: True, timeout_s=5)
    assert q.items == ["a", "b"]


class TickWorker:
    """collect() returns three segments per tick."""
    worker_id, idle = 0, False

    def collect(self, min_segments, max_steps):
        return ["s1", "s2", "s3"]

    def drain_episodes(self):
        return []


def test_a_producer_with_put_many_hands_over_a_tick_in_one_call():
    singles, batches = [], []
    RolloutProducer(TickWorker(), singles.append, put_many=batches.append).tick()
    assert singles == [] and batches == [["s1", "s2", "s3"]]
    RolloutProducer(TickWorker(), singles.append).tick()
    assert singles == ["s1", "s2", "s3"]


# --- learner takes on a real Ray queue -------------------------------------------------------------------------------
@pytest.mark.slow
def test_take_batch_on_a_ray_queue_is_fifo_and_leaves_the_rest(ray_cluster):
    from ray.util.queue import Queue

    from acce.runtime.ray_clients import take_batch, take_waiting
    q = Queue(maxsize=32)
    try:
        q.put_nowait_batch(list(range(10)))
        assert take_batch(q, 7, lambda: False, timeout_s=30) == list(range(7))
        assert take_waiting(q, 5, timeout_s=30) == [7, 8, 9]
        assert take_waiting(q, 5, timeout_s=30) == []
        assert take_batch(q, 2, lambda: True, timeout_s=30) is None  # stopped: nothing taken
        q.put_nowait_batch([np.arange(3), np.arange(4)])
        got = take_batch(q, 2, lambda: False, timeout_s=30)
        assert [g.tolist() for g in got] == [[0, 1, 2], [0, 1, 2, 3]]
    finally:
        q.shutdown()
