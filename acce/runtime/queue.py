"""RolloutQueue (bounded, producers block: pacing, not dropping) and the gates that bound staleness.

Staleness = learner_version at consumption − behavior_version (queue time counts). Segments are consumed FIFO in
batches of `batch_segments`, each batch followed by `steps_per_batch` optimizer steps, so the n-th segment admitted
is consumed at learner version (n // batch_segments) * steps_per_batch. The StalenessGate admits a new segment
sampled with weights v only if that consumption version − v ≤ max_staleness; otherwise the producer waits for
fresher weights. Nothing is dropped; a segment that still arrives too stale (out-of-order completion across
workers) is excluded by the learner and counted. When an update may stop early (learner.kl_stop) it takes at most
`steps_per_batch` steps, and the learner reports what it really reached (`consumed`): predictions then count from
there, and stay upper bounds.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from acce.bykey import ByKey


@dataclass(frozen=True)
class QueueStats(ByKey):
    """A RolloutQueue's fill and waits so far."""
    size: int
    """items waiting now"""
    capacity: int
    """the most items it holds (runtime.queue_capacity)"""
    put_wait_s: float = 0.0
    """seconds producers spent in `put` (blocked while full, and the put itself)"""
    get_wait_s: float = 0.0
    """seconds consumers spent in `get_batch` waiting for a full batch"""
    full_waits: int = 0
    """puts that found the queue full (`put` waited, `try_put` refused)"""


class RolloutQueue:
    """Bounded FIFO; `put` blocks while full (timeout -> TimeoutError), `get_batch` blocks until n items."""

    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError(f"queue capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._items: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self.put_wait_s = 0.0
        self.get_wait_s = 0.0
        self.puts = 0
        self.full_waits = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Any, timeout_s: float | None = None) -> None:
        t0 = time.perf_counter()
        with self._cv:
            if len(self._items) >= self.capacity:
                self.full_waits += 1
            if not self._cv.wait_for(lambda: len(self._items) < self.capacity, timeout=timeout_s):
                raise TimeoutError(f"rollout queue stayed full for {timeout_s} s (is the learner alive?)")
            self._items.append(item)
            self.puts += 1
            self.put_wait_s += time.perf_counter() - t0
            self._cv.notify_all()

    def try_put(self, item: Any) -> bool:
        with self._cv:
            if len(self._items) >= self.capacity:
                self.full_waits += 1
                return False
            self._items.append(item)
            self.puts += 1
            self._cv.notify_all()
            return True

    def get_batch(self, n: int, timeout_s: float | None = None) -> list[Any]:
        if n > self.capacity:
            raise ValueError(f"batch of {n} can never fill a queue of capacity {self.capacity}")
        t0 = time.perf_counter()
        with self._cv:
            if not self._cv.wait_for(lambda: len(self._items) >= n, timeout=timeout_s):
                raise TimeoutError(f"no {n} segments within {timeout_s} s (are the rollout workers alive?)")
            batch = [self._items.popleft() for _ in range(n)]
            self.get_wait_s += time.perf_counter() - t0
            self._cv.notify_all()
            return batch

    def stats(self) -> QueueStats:
        return QueueStats(size=len(self._items), capacity=self.capacity, put_wait_s=self.put_wait_s,
                          get_wait_s=self.get_wait_s, full_waits=self.full_waits)


def put_until_stopped(queue, item: Any, stopped: Callable[[], bool], timeout_s: float, poll_s: float = 0.5) -> bool:
    """Put into a bounded queue (`put(item, timeout=...)` raising queue.Full, as ray.util.queue.Queue does), blocking
    while it is full (pacing) but waking every `poll_s` to see a stop: a producer blocked on a full queue when the
    learner stops would otherwise hold the shutdown for the whole timeout. Returns False if stopped first (the item
    is not delivered, whole or in part); a queue full for `timeout_s` while running means the consumer is gone and
    raises TimeoutError."""
    import queue as queue_mod  # ray.util.queue.Full subclasses queue.Full

    deadline = time.perf_counter() + timeout_s
    while not stopped():
        try:
            queue.put(item, timeout=min(poll_s, max(deadline - time.perf_counter(), 0.001)))
            return True
        except queue_mod.Full:
            if time.perf_counter() >= deadline:
                raise TimeoutError(f"the rollout queue stayed full for {timeout_s:g} s (runtime.timeout_s): is the "
                                   "learner alive?") from None
    return False


def put_all_until_stopped(queue, items: list, stopped: Callable[[], bool], timeout_s: float,
                          poll_s: float = 0.5) -> bool:
    """put_until_stopped for several items in order, in one call when the queue has room for all of them
    (`put_nowait_batch`, as ray.util.queue.Queue has: all or nothing); otherwise one by one, blocking while full. A
    producer's segments of one tick then cost one round trip to a remote queue instead of one each. Returns False if
    stopped first (the items not yet put are not delivered)."""
    import queue as queue_mod

    if len(items) > 1 and hasattr(queue, "put_nowait_batch"):
        try:
            queue.put_nowait_batch(list(items))
            return True
        except queue_mod.Full:
            pass  # not room for all: wait for room one item at a time (pacing)
    return all(put_until_stopped(queue, item, stopped, timeout_s, poll_s) for item in items)


class StalenessGate:
    """Admission by predicted staleness at consumption (see module docstring). max_staleness < 0: unbounded."""

    def __init__(self, batch_segments: int, steps_per_batch: int, max_staleness: int, start_version: int = 0):
        """start_version: the learner's version when the run (or its resume) starts; predictions count from it"""
        self.batch_segments, self.steps_per_batch, self.max_staleness = batch_segments, steps_per_batch, max_staleness
        self.admitted = 0
        self.denied = 0
        self.released = 0
        """admissions given back by workers that died before delivering (release_worker)"""
        self._open: set[tuple[int, int]] = set()
        """(worker, env) slots whose latest admission is not known to be delivered: an env holds one admission
        per segment, so its next acquisition means the previous segment was delivered"""
        self._lock = threading.Lock()
        self.updates_done, self.version_done = 0, int(start_version)
        """updates the learner reported finished since this gate was made (consumed), and its version after them"""

    def predicted_consumption_version(self, n: int) -> int:
        """Learner version when the n-th admitted segment is consumed: exact while every update takes
        steps_per_batch steps, an upper bound when updates stop early (each later update counts in full)."""
        return self.version_done + (n // self.batch_segments - self.updates_done) * self.steps_per_batch

    def consumed(self, updates: int, version: int) -> None:
        """The learner has finished `updates` updates since this gate was made and is at `version`. Without this report an update that stopped
        early (learner.kl_stop) would leave every prediction ahead of the real version by the steps it skipped:
        producers would be told their segments come too stale, and the run would stall."""
        with self._lock:
            if updates >= self.updates_done:
                self.updates_done, self.version_done = int(updates), int(version)

    def try_acquire(self, worker_id: int, env_index: int, version: int) -> bool:
        with self._lock:
            if self.max_staleness >= 0 and \
                    self.predicted_consumption_version(self.admitted) - version > self.max_staleness:
                self.denied += 1
                return False
            self.admitted += 1
            self._open.add((worker_id, env_index))
            return True

    def try_acquire_many(self, worker_id: int, env_indices: list[int], version: int) -> list[bool]:
        """try_acquire for each env in order, as one call: a remote worker asks for all its waiting envs in one round
        trip instead of one each (the same answers as the calls made one after another)."""
        return [self.try_acquire(worker_id, int(i), version) for i in env_indices]

    def release_worker(self, worker_id: int) -> int:
        """A worker's process died: the segments it was admitted for and had not delivered never reach the queue.
        Without giving them back every later prediction runs ahead of real consumption, producers are told their
        segments would be too stale, the learner never gets a batch, and the run stalls (seen after a kill -9 with
        64-segment batches). A segment delivered just before the death is given back too: it may then be consumed
        staler than predicted, which the learner's exclusion catches and counts. Returns how many were released."""
        with self._lock:
            lost = [key for key in self._open if key[0] == worker_id]
            self._open.difference_update(lost)
            self.admitted -= len(lost)
            self.released += len(lost)
            return len(lost)

    def shift(self, slots: int) -> None:
        """The consumer took `slots` fewer segments from this stream in a batch than the FIFO model assumes (negative:
        more). Mixed batches do this when the imagined queue runs short and simulator segments fill its share; moving
        the count keeps later predictions aligned with the real consumption (without it the simulator stream would
        be predicted ever more stale and its producers would wait forever)."""
        with self._lock:
            self.admitted += int(slots)


class SyncGate:
    """The barrier baseline: every segment is sampled with the round's weights, one per env per round, and exactly
    `segments_per_version` of them per learner version (learner.batch_segments: sync learns from batches as large
    as async's, in as many rounds as that takes). The learner's report after its update (`consumed`, as to a
    StalenessGate) opens the next version's first round: sync and async run the same loops with another gate."""

    def __init__(self, segments_per_round: int, segments_per_version: int | None = None, start_version: int = 0):
        """segments_per_round: envs over all workers; segments_per_version: default one round"""
        self.segments_per_round = segments_per_round
        self.segments_per_version = segments_per_version or segments_per_round
        self.round_version = int(start_version)
        self.admitted_this_version = 0
        self._taken: set[tuple[int, int]] = set()
        """(worker, env) admitted in the current round; when every env has been, the next round starts"""
        self._open: set[tuple[int, int]] = set()
        """admissions at this version not known to be delivered (see StalenessGate._open)"""
        self.denied = 0
        self.released = 0
        self._lock = threading.Lock()

    @property
    def admitted_this_round(self) -> int:
        return len(self._taken)

    def open_round(self, version: int) -> None:
        with self._lock:
            self.round_version, self.admitted_this_version = int(version), 0
            self._taken.clear()
            self._open.clear()

    def consumed(self, updates: int, version: int) -> None:
        """The learner consumed the round's batch and published `version`: the next version's rounds open."""
        self.open_round(version)

    def try_acquire(self, worker_id: int, env_index: int, version: int) -> bool:
        key = (worker_id, env_index)
        with self._lock:
            if key in self._taken and len(self._taken) >= self.segments_per_round:
                self._taken.clear()  # every env has its segment of this round: the next round starts
            if version != self.round_version or key in self._taken or \
                    self.admitted_this_version >= self.segments_per_version:
                self.denied += 1
                return False
            self._taken.add(key)
            self._open.add(key)
            self.admitted_this_version += 1
            return True

    def try_acquire_many(self, worker_id: int, env_indices: list[int], version: int) -> list[bool]:
        """try_acquire for each env in order, as one call (StalenessGate.try_acquire_many)."""
        return [self.try_acquire(worker_id, int(i), version) for i in env_indices]

    def release_worker(self, worker_id: int) -> int:
        """A dead worker's undelivered admissions go back, as in StalenessGate.release_worker: the batch of this
        version would otherwise never fill."""
        with self._lock:
            lost = [key for key in self._open if key[0] == worker_id]
            self._open.difference_update(lost)
            self._taken.difference_update(lost)
            self.admitted_this_version -= len(lost)
            self.released += len(lost)
            return len(lost)
