"""Roles: what every placement runs (docs/design.md §1). A placement (acce/runtime/local.py, ray_runtime.py) only
creates roles, connects them by named queues and a gate, ticks them, drains them and restarts what dies.

  RolloutProducer (sim or imagined RolloutWorker) --put--> queue ; LearnerConsumer <--take-- queue(s)
  LearnerConsumer --publish--> inference servers ; --consumed--> gate (StalenessGate: async, SyncGate: sync)
  WMTrainerRole (acce/runtime/imagination.py) --publication--> imagination producers
  EvaluatorRole (acce/runtime/eval_role.py): policy snapshots submitted by the driver --> EvalResult per tick

Sync and async differ only in the gate (`make_gate`); the loops are the same. What roles hand back is typed
(`ProducerStats`, `LearnerStats`, `RuntimeStats`, `Drained`); the metric dicts that go to TensorBoard stay dicts
keyed by their documented names (docs/metrics.md).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from acce.bykey import ByKey
from acce.runtime.queue import StalenessGate, SyncGate
from acce.runtime.worker import RolloutWorkerStats
from acce.serving.inference import InferenceServer, ServerStats
from acce.types import Segment

if TYPE_CHECKING:
    from acce.runtime.imagination import ImaginationWorkerStats  # (imagination imports this module)


@runtime_checkable
class Role(Protocol):
    """A placement-agnostic unit of a run: the placement calls `tick` in a loop (Ray: its own actor thread;
    local: in a fixed order), `drain` to collect what it produced, `state` for checkpoints."""

    def tick(self) -> bool:
        """One bounded piece of work; False when there was nothing to do (the placement may back off or stop)."""
        ...

    def drain(self) -> Any:
        """What the role produced since the last drain (episodes, updates) and its counters, typed."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint needs to continue this role ({} when nothing)."""
        ...


@dataclass(frozen=True)
class ProducerStats(ByKey):
    """A rollout producer's counters (sim or imagined), as drained."""
    worker_id: int
    """RolloutWorker.worker_id (imagination workers: 1000 + w)"""
    env_steps: int = 0
    """env steps of this process since it started (a restarted actor counts from zero; see `Tally`)"""
    segments: int = 0
    """complete segments produced"""
    decisions: int = 0
    """inference decisions applied"""
    busy_s: float = 0.0
    """seconds producing: stepping envs, rendering, waiting for inference"""
    idle_s: float = 0.0
    """seconds paused: gate denials, a full queue"""
    alive_s: float = 0.0
    """seconds since the first tick"""
    pid: int = 0
    """process id (a changed pid means the placement restarted the role)"""
    counters: RolloutWorkerStats | ImaginationWorkerStats = field(default_factory=RolloutWorkerStats)
    """the worker's own counters, a snapshot: a sim worker's RolloutWorkerStats (RolloutWorker.stats), an
    imagination worker's ImaginationWorkerStats (ImaginationWorker.stats())"""
    inference: ServerStats | None = None
    """the producer's own in-process InferenceServer's counters (runtime.inference_placement=worker), else None"""
    policy_version: int = -1
    """the version that server runs next (-1 without one)"""


@dataclass(frozen=True)
class LearnerStats(ByKey):
    """The learner consumer's counters, as drained."""
    version: int
    """learner_version after the last update (docs/design.md §4)"""
    updates_done: int = 0
    """updates finished since this run (or resume) started: what the gate is told"""
    wait_s: float = 0.0
    """seconds waiting for a batch (learner idle)"""
    busy_s: float = 0.0
    """seconds updating and publishing"""
    alive_s: float = 0.0
    """seconds since the first tick"""


@dataclass(frozen=True)
class Drained(ByKey):
    """What a poll (or the final stop) hands the driver."""
    updates: tuple[dict[str, float], ...] = ()
    """one metric dict per learner update (docs/metrics.md names), in order"""
    episodes: tuple[dict[str, Any], ...] = ()
    """finished training episodes: return, length, success, task_id, source, seed, worker_id"""


@dataclass(frozen=True)
class ImaginationStats(ByKey):
    """The imagination producers and the world-model trainer, summed."""
    imagined_steps: int = 0
    """imagined env steps over all imagination workers (restarts included)"""
    imagined_queue_size: int = 0
    """imagined segments waiting for the learner"""
    wm: dict[str, float] = field(default_factory=dict)
    """wm/* metrics by their TensorBoard names (trainer, imagined envs, publish lag)"""


@dataclass(frozen=True)
class RuntimeStats(ByKey):
    """The runtime's state as the driver logs it (progress, throughput, weights, queue)."""
    env_steps: int
    """simulator env steps over all rollout workers, restarts included (imagined steps are counted apart)"""
    learner_version: int
    """learner_version (docs/design.md §4)"""
    server_version: int
    """the version the inference server runs next (publish_lag = learner_version − this)"""
    queue_size: int
    """simulator segments waiting for the learner"""
    queue_capacity: int
    """runtime.queue_capacity"""
    swap_ms: float = 0.0
    """the server's last weight swap, milliseconds"""
    server: ServerStats = field(default_factory=ServerStats)
    """InferenceServer.stats (batches, rows, forward_s, swaps, ...); all zero before the first poll"""
    workers: tuple[ProducerStats, ...] = ()
    """per simulator rollout worker"""
    restarts: int = 0
    """rollout workers that came back in a new process"""
    actor_idle_frac: float | None = None
    """1 − busy / alive over rollout workers (None where not measured: the local runtime)"""
    learner_idle_frac: float | None = None
    """1 − busy / alive of the learner (None where not measured)"""
    imagination: ImaginationStats | None = None
    """None when imagination is off"""

    @property
    def imagined_steps(self) -> int:
        if self.imagination is None:
            raise AttributeError("imagined_steps: imagination is off")
        return self.imagination.imagined_steps

    @property
    def imagined_queue_size(self) -> int:
        if self.imagination is None:
            raise AttributeError("imagined_queue_size: imagination is off")
        return self.imagination.imagined_queue_size

    @property
    def wm(self) -> dict[str, float]:
        if self.imagination is None:
            raise AttributeError("wm: imagination is off")
        return self.imagination.wm


def sum_server_stats(stats: list[ServerStats]) -> ServerStats:
    """Several servers' counters as one (inference_placement=worker: every worker's own server); the last swap is the
    slowest of the servers' last swaps."""
    if not stats:
        return ServerStats()
    return ServerStats(**{f.name: max(getattr(s, f.name) for s in stats) if f.name == "swap_ms_last"
                          else sum(getattr(s, f.name) for s in stats) for f in fields(ServerStats)})


def retire_server(retired: ServerStats, dead: ServerStats | None) -> ServerStats:
    """What the workers' dead processes' own servers counted (runtime.inference_placement=worker), plus `dead`'s last
    drained counters: a restarted worker's server counts from zero again, so summing this beside the live servers
    keeps the inference/* counters from going back (as `rebase` does for env steps). A dead server's last swap is no
    one's last swap."""
    if dead is None:
        return retired
    return replace(sum_server_stats([retired, dead]), swap_ms_last=0.0)


def idle_frac(busy_s: float, alive_s: float) -> float:
    return 1.0 - busy_s / max(alive_s, 1e-9)


# --- restarts ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tally:
    """A restartable role's running count as the driver sees it across restarts."""
    pid: int
    """process id of the last drain"""
    count: int
    """the count the process reported (from zero in each process)"""
    base: int = 0
    """what earlier processes counted before they died"""

    @property
    def total(self) -> int:
        return self.base + self.count


def rebase(prev: Tally | None, pid: int, count: int) -> tuple[Tally, bool]:
    """The new tally after a drain that reported `count` from process `pid`, and whether the process is new (a
    restart). A restarted process counts from zero again: what the dead one counted moves into `base`, so totals
    (env steps, imagined steps) never go back."""
    if prev is None:
        return Tally(pid, count), False
    base = prev.base + (prev.count if count < prev.count else 0)
    return Tally(pid, count, base), pid != prev.pid


# --- the gate ------------------------------------------------------------------------------------------------------
def gate_spec(cfg, total_envs: int, start_version: int) -> tuple[type, tuple]:
    """The gate's class and arguments (Ray builds it as a named actor): runtime.mode=async paces producers by
    predicted staleness, sync admits one version's batch in rounds."""
    lc = cfg.learner
    if cfg.runtime.mode == "sync":
        return SyncGate, (total_envs, lc.batch_segments, start_version)
    return StalenessGate, (lc.batch_segments, lc.steps_per_update, lc.max_staleness, start_version)


def make_gate(cfg, total_envs: int, start_version: int) -> StalenessGate | SyncGate:
    cls, args = gate_spec(cfg, total_envs, start_version)
    return cls(*args)


def rollout_kwargs(cfg) -> dict[str, Any]:
    """RolloutWorker arguments shared by sim and imagination workers (one chunk timeline for both)."""
    r, lc = cfg.rollout, cfg.learner
    return dict(segment_len=r.segment_len, chunk_len=cfg.policy.chunk_len, exec_horizon=r.execution_horizon,
                max_delay=cfg.policy.max_delay_steps, gamma=lc.gamma, delay_aware=lc.delay_correction,
                align_decisions=r.align_decisions)


# --- the roles -----------------------------------------------------------------------------------------------------
class RolloutProducer:
    """Role: a RolloutWorker or ImaginationWorker whose complete segments go to `put`, whole or not at all.

    put(segment) may block (pacing) and returns False when the run stops first; put_many(segments), if given, takes
    a tick's segments in order in one call instead (a remote queue: one round trip); on_episode(ep) runs where the
    worker runs (Ray: the actor's own curriculum); refresh() runs before each tick (imagination: pull the newest
    world model); own_server: the worker's own in-process InferenceServer (inference_placement=worker), which
    `load_weights` stages published versions in and `stats` reports."""

    def __init__(self, worker, put: Callable[[Segment], Any], *, max_steps: int = 64,
                 on_episode: Callable[[dict], None] | None = None, refresh: Callable[[], None] | None = None,
                 put_many: Callable[[list[Segment]], Any] | None = None, own_server: InferenceServer | None = None):
        self.worker, self.put, self.put_many, self.max_steps = worker, put, put_many, max_steps
        self.own_server = own_server
        """the worker's in-process server when it has one of its own (runtime.inference_placement=worker)"""
        self.on_episode, self.refresh = on_episode, refresh
        self.episodes: list[dict[str, Any]] = []
        self.busy_s = self.idle_s = 0.0
        self.started: float | None = None

    @property
    def worker_id(self) -> int:
        return self.worker.worker_id

    def tick(self) -> bool:
        self.started = self.started or time.time()
        if self.refresh is not None:
            self.refresh()
        t0 = time.perf_counter()
        segments = self.worker.collect(min_segments=1, max_steps=self.max_steps)
        self.busy_s += time.perf_counter() - t0
        for ep in self.worker.drain_episodes():
            ep["worker_id"] = self.worker.worker_id
            if self.on_episode is not None:
                self.on_episode(ep)
            self.episodes.append(ep)
        t0 = time.perf_counter()
        if self.put_many is not None and segments:
            self.put_many(segments)
        else:
            for seg in segments:
                self.put(seg)
        self.idle_s += time.perf_counter() - t0
        return bool(segments) or not self.worker.idle

    def stats(self, pid: int = 0) -> ProducerStats:
        c = self.worker.stats  # RolloutWorker: a RolloutWorkerStats property; ImaginationWorker: a method
        c = c() if callable(c) else c
        own = self.own_server
        return ProducerStats(worker_id=self.worker.worker_id, env_steps=int(c.env_steps),
                             segments=int(c.segments), decisions=int(c.decisions),
                             busy_s=self.busy_s, idle_s=self.idle_s,
                             alive_s=time.time() - self.started if self.started else 0.0, pid=pid, counters=c,
                             inference=own.stats if own is not None else None,
                             policy_version=own.version if own is not None else -1)

    def load_weights(self, version: int, state: Any) -> None:
        """Stage a published version in the producer's own server (inference_placement=worker: the learner pushes)."""
        own = self.own_server
        if own is None:
            raise RuntimeError("load_weights: this producer's policy is a shared server's client, not its own server")
        own.load_weights(version, state)

    def drain(self) -> tuple[list[dict[str, Any]], ProducerStats]:
        eps, self.episodes = self.episodes, []
        return eps, self.stats(os.getpid())

    def state(self) -> dict[str, Any]:
        return {}  # a producer holds no state a checkpoint needs: a resumed run starts fresh episodes

    def close(self) -> None:
        self.worker.close()


class LearnerConsumer:
    """Role: takes a batch (`take() -> list | None`, None: not ready or stopping), updates, publishes
    (`publish(version, trainable_state)`), and tells every gate what the update reached (`gate.consumed`).

    mix(batch, version) adds the source-mixing metrics when batches mix sources. Holds `lock` while it updates and
    publishes: a snapshot (checkpoint, evaluation) never sees a half-applied optimizer step."""

    def __init__(self, learner, take: Callable[[], "list | None"], publish: Callable[[int, Any], None], gate, *,
                 mix: Callable[[list, int], dict] | None = None, stamp_wait: bool = False, max_version: int = 0):
        """gate: a gate, or a sequence of gates (imagination: the sim and the imagined stream's), each told what every
        update reached; stamp_wait: write queue/learner_wait_s into each update (Ray, where the learner waits on other
        processes; the local runtime never waits); max_version: take no batch once the learner's version is there
        (train.max_versions; 0 = no cap), so a learner that runs ahead of the driver's polls stops at the budget"""
        self.learner, self.take, self.publish_fn = learner, take, publish
        self.gates = tuple(gate) if isinstance(gate, (list, tuple)) else (gate,)
        self.mix, self.stamp_wait, self.max_version = mix, stamp_wait, int(max_version)
        self.updates0 = learner.updates  # a resumed learner has updates before this run's gate existed
        self.lock = threading.Lock()
        self.updates: list[dict[str, float]] = []
        self.wait_s = self.busy_s = 0.0
        self.started: float | None = None

    @property
    def version(self) -> int:
        return self.learner.version

    def publish(self) -> int:
        self.publish_fn(self.learner.version, self.learner.trainable_state())
        return self.learner.version

    def tick(self) -> bool:
        self.started = self.started or time.time()
        if self.max_version and self.learner.version >= self.max_version:
            return False  # the version budget is spent: the driver ends the run on its next turn
        t0 = time.perf_counter()
        batch = self.take()
        self.wait_s += time.perf_counter() - t0
        if batch is None:
            return False
        with self.lock:
            t1 = time.perf_counter()
            mix = self.mix(batch, self.learner.version) if self.mix is not None else {}
            upd = {**self.learner.update(batch), **mix}
            if self.stamp_wait:
                upd["queue/learner_wait_s"] = self.wait_s
            self.updates.append(upd)
            self.publish()
            # what the update really reached (learner.kl_stop may end it early); a SyncGate opens the next round.
            # Every stream's gate: one left out would predict full updates and stall its producers.
            for gate in self.gates:
                gate.consumed(self.learner.updates - self.updates0, self.learner.version)
            self.busy_s += time.perf_counter() - t1
        return True

    def stats(self) -> LearnerStats:
        return LearnerStats(version=self.learner.version, updates_done=self.learner.updates - self.updates0,
                            wait_s=self.wait_s, busy_s=self.busy_s,
                            alive_s=time.time() - self.started if self.started else 0.0)

    def drain(self) -> tuple[list[dict[str, float]], LearnerStats]:
        ups, self.updates = self.updates, []
        return ups, self.stats()

    def state(self) -> dict[str, Any]:
        with self.lock:
            return self.learner.state_dict()

    def policy_state(self) -> dict[str, Any]:
        with self.lock:
            return self.learner.policy.policy_state()
