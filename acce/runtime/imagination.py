"""Imagination roles (docs/design.md §7), placement-agnostic: the online world-model trainer and imagination workers.

  sim RolloutWorker over RecordingEnv --real Episodes--> WMTrainerRole (co-trains the world model, publishes)
  WMTrainerRole --publication {version, desc, state, newest real episodes}--> ImaginationWorker (hot swap)
  ImaginationWorker = RolloutWorker over an ImaginedEnv, same inference server as the sim workers --> imagined queue

The world model and ImaginedEnv come in through factories (acce.wiring), so nothing here imports `worldmodel`.
The runtimes place these classes: acce/runtime/local.py runs them in-process and deterministically (LocalImagination
below), acce/runtime/ray_imagination.py as restartable Ray actors beside the sim workers.

A publication is applied by the worker's own thread between `collect` calls, i.e. between control steps, and
ImaginedEnv swaps under the lock its steps hold, so no step mixes two world-model versions. Each decision is
stamped with the version at its decision point (a chunk can span a swap, like behavior_version).
"""
from __future__ import annotations

import math
import os
import tempfile
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from acce.bykey import ByKey
from acce.runtime.mixer import SourceMixer
from acce.runtime.queue import RolloutQueue, StalenessGate
from acce.runtime.roles import ImaginationStats, RolloutProducer, rollout_kwargs
from acce.runtime.worker import RolloutWorker, RolloutWorkerStats
from acce.store.recorder import RecordingEnv
from acce.types import Episode, Segment

IMAGINATION_WORKER_ID0 = 1000
"""imagination worker w has worker_id 1000 + w (segments, episode ids and latency seeds stay distinct from sim)"""


class RecordingEnvFactory:
    """Picklable: wraps the sim env factory so each worker's env records `record_fraction` of its slots to `sink`."""

    def __init__(self, make_env: Callable[[int], Any], sink: Callable[[list[Episode]], None], record_fraction: float):
        self.make_env, self.sink, self.record_fraction = make_env, sink, record_fraction

    def __call__(self, worker_id: int):
        env = self.make_env(worker_id)
        slots = list(range(max(1, math.ceil(self.record_fraction * env.num_envs))))
        return RecordingEnv(env, self.sink, slots=slots, source="sim")


class WMTrainerRole:
    """Co-trains the world model on real episodes and decides when to publish a new wm_version.

    `make_trainer(first_episode)` builds the WorldModelTrainer (fresh, or from `imagination.wm_init_from`); it is
    called lazily because a fresh model takes its state/action sizes from the data. Pacing: at most
    `wm_train_ratio` optimizer steps per real transition received (0: unlimited), in chunks of
    `wm_steps_per_publish`, once `wm_min_episodes` episodes are buffered."""

    def __init__(self, make_trainer: Callable[[Episode], Any], icfg, *,
                 take: Callable[[], list[Episode]] | None = None,
                 publish: Callable[[dict[str, Any]], None] | None = None):
        """take(): real episodes recorded since the last tick; publish(publication): hand a new world-model version
        to the imagination producers (both wired by the placement; `tick` needs them)"""
        self.make_trainer, self.icfg, self.take, self.publish = make_trainer, icfg, take, publish
        self.trainer = None
        self.lock = threading.Lock()
        """held while a tick trains and publishes: a checkpoint never sees a half-applied optimizer step"""
        self.fresh: deque[Episode] = deque(maxlen=icfg.start_episodes_per_publish)
        """newest real episodes: the start states every publication carries"""
        self.real_episodes, self.real_transitions, self.trained_steps = 0, 0, 0
        self.published_version = -1
        self.publishes = 0
        self.dropped: dict[str, int] = {}
        """per recording sink: real episodes dropped because the episode queue was full"""
        self.last_metrics: dict[str, float] = {}

    @property
    def version(self) -> int:
        return -1 if self.trainer is None else int(self.trainer.version)

    def add_episodes(self, episodes: list[Episode]) -> int:
        real = [ep for ep in episodes if ep.source != "imagined"]
        if real and self.trainer is None:
            self.trainer = self.make_trainer(real[0])
        if self.trainer is None:
            return 0
        kept = self.trainer.add_episodes(episodes)  # the trainer refuses (and counts) imagined episodes itself
        self.fresh.extend(real)
        self.real_episodes += len(real)
        self.real_transitions += sum(ep.num_steps for ep in real)
        return kept

    def note_dropped(self, sink_id: str, dropped: int) -> None:
        self.dropped[sink_id] = max(self.dropped.get(sink_id, 0), int(dropped))

    def allowance(self) -> int:
        """Optimizer steps the trainer may take now."""
        if self.trainer is None or len(self.trainer.buffer) < self.icfg.wm_min_episodes:
            return 0
        n = self.icfg.wm_steps_per_publish
        if self.icfg.wm_train_ratio > 0:
            n = min(n, int(self.icfg.wm_train_ratio * self.real_transitions) - self.trained_steps)
        return max(n, 0)

    def train(self) -> int:
        n = self.allowance()
        if n:
            self.last_metrics = self.trainer.train_steps(n)
            self.trained_steps += n
        return n

    def publication(self) -> dict[str, Any] | None:
        """The next world-model version for imagination workers, or None when nothing new is due. The first one
        waits for training (or a pretrained start); later ones come every wm_steps_per_publish steps."""
        if self.trainer is None or not self.fresh:
            return None
        v = self.trainer.version
        if self.published_version < 0:
            due = v > 0
        else:
            due = v - self.published_version >= self.icfg.wm_steps_per_publish
        if not due:
            return None
        version, state = self.trainer.publish()
        self.published_version, self.publishes = version, self.publishes + 1
        return {"version": version, "desc": self.trainer.model.describe(), "state": state,
                "episodes": list(self.fresh)}

    def tick(self) -> bool:
        """Role tick: add what was recorded, train within the allowance, publish when due; False when idle."""
        episodes = self.take() if self.take is not None else []
        with self.lock:
            if episodes:
                self.add_episodes(episodes)
            trained = self.train()
            pub = self.publication()
        if pub is not None and self.publish is not None:
            self.publish(pub)
        return bool(trained or episodes)

    def drain(self) -> dict[str, float]:
        with self.lock:
            return self.metrics()

    def state(self) -> dict[str, Any]:
        return {}  # the world model is checkpointed as its own file (save, to_bytes)

    def metrics(self) -> dict[str, float]:
        out = dict(self.last_metrics)
        out.update({"wm/version": float(self.version), "wm/published_version": float(self.published_version),
                    "wm/publishes": float(self.publishes), "wm/real_episodes": float(self.real_episodes),
                    "wm/real_transitions": float(self.real_transitions),
                    "wm/dropped_real_episodes": float(sum(self.dropped.values()))})
        return out

    def save(self, path: str) -> bool:
        if self.trainer is None or not bool(self.trainer.model.stats_ready):
            return False
        self.trainer.save(path)
        return True

    def to_bytes(self) -> bytes | None:
        """The world model as `save` writes it, for a driver in another process (it owns the run directory)."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "worldmodel.pt")
            with self.lock:
                saved = self.save(path)
            return open(path, "rb").read() if saved else None


@dataclass(frozen=True)
class ImaginationWorkerStats(ByKey):
    """An imagination worker's counters (ImaginationWorker.stats): its RolloutWorker's, its ImaginedEnv's, and the
    world-model version it steps with. All zero (wm_version -1) before the first publication."""
    env_steps: int = 0
    """imagined env steps of this process (RolloutWorker.stats.env_steps)"""
    segments: int = 0
    """complete imagined segments produced"""
    decisions: int = 0
    """inference decisions applied"""
    wm_version: int = -1
    """the world-model version the ImaginedEnv steps with (-1: none yet)"""
    env_stats: dict[str, float] = field(default_factory=dict)
    """ImaginedEnv.stats: steps, episodes, gate_truncations, horizon_truncations, terminations, swaps"""
    worker: RolloutWorkerStats = field(default_factory=RolloutWorkerStats)
    """all of the RolloutWorker's counters (RolloutWorker.stats: env_time_s, infer_time_s, ...)"""


class ImaginationWorker:
    """A RolloutWorker whose env is an ImaginedEnv built from the first publication; later ones hot-swap.

    `offer` may be called from any thread; the publication is applied by `collect` before it steps. Until the
    first publication there is no env and `collect` returns nothing (the learner does not wait for it)."""

    def __init__(self, make_env: Callable[[int, dict], Any], policy, *, worker_id: int, gate=None, latency=None,
                 **rollout: Any):
        self.make_env, self.policy, self.worker_id = make_env, policy, worker_id
        self.gate, self.latency, self.rollout = gate, latency, rollout
        self.worker: RolloutWorker | None = None
        self._staged: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._seen: deque[str] = deque(maxlen=4096)
        """episode ids already given to the env as start states (publications overlap)"""

    @property
    def wm_version(self) -> int:
        return -1 if self.worker is None else int(self.worker.env.wm_version)

    @property
    def env(self):
        return None if self.worker is None else self.worker.env

    def offer(self, publication: dict[str, Any]) -> None:
        with self._lock:
            if publication["version"] > max(self.wm_version, -1 if self._staged is None else self._staged["version"]):
                self._staged = publication

    def _apply(self) -> None:
        with self._lock:
            pub, self._staged = self._staged, None
        if pub is None:
            return
        if self.worker is None:
            env = self.make_env(self.worker_id, pub)
            self.worker = RolloutWorker(env, self.policy, worker_id=self.worker_id, latency=self.latency,
                                        source="imagined", gate=self.gate, **self.rollout)
        else:
            self.worker.env.load_weights(pub["version"], pub["state"])
        new = [ep for ep in pub["episodes"] if ep.episode_id not in self._seen]
        self._seen.extend(ep.episode_id for ep in new)
        self.worker.env.add_episodes(new)

    def collect(self, min_segments: int = 1, max_steps: int | None = None) -> list[Segment]:
        self._apply()
        if self.worker is None:
            return []
        return self.worker.collect(min_segments=min_segments, max_steps=max_steps)

    @property
    def idle(self) -> bool:
        """Nothing to do: no world model yet, or every env waits for fresher policy weights."""
        return self.worker is None or bool(self.worker.paused.all())

    @property
    def num_envs(self) -> int:
        return 0 if self.worker is None else self.worker.env.num_envs

    def drain_episodes(self) -> list[dict[str, Any]]:
        return [] if self.worker is None else self.worker.drain_episodes()

    def stats(self) -> ImaginationWorkerStats:
        if self.worker is None:
            return ImaginationWorkerStats()
        c = self.worker.stats
        return ImaginationWorkerStats(env_steps=c.env_steps, segments=c.segments, decisions=c.decisions,
                                      wm_version=self.wm_version,
                                      env_stats=dict(self.worker.env.stats), worker=c)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


def imagination_metrics(worker_stats: list[ImaginationWorkerStats], trainer_version: int) -> dict[str, float]:
    """wm/imagined/* over all imagination workers (ImaginedEnv's counters summed; fractions of finished branches)
    and wm/publish_lag (trainer version minus the oldest version an imagination worker steps with)."""
    envs = [s.env_stats for s in worker_stats if s.env_stats]
    if not envs:
        return {}
    tot = {k: sum(e.get(k, 0) for e in envs) for k in ("steps", "episodes", "gate_truncations",
                                                       "horizon_truncations", "terminations", "swaps")}
    ends = max(tot["episodes"], 1)
    oldest = min(s.wm_version for s in worker_stats if s.env_stats)
    return {"wm/imagined/steps": float(tot["steps"]), "wm/imagined/branches": float(tot["episodes"]),
            "wm/imagined/mean_length": tot["steps"] / ends, "wm/imagined/gate_frac": tot["gate_truncations"] / ends,
            "wm/imagined/horizon_frac": tot["horizon_truncations"] / ends,
            "wm/imagined/terminated_frac": tot["terminations"] / ends, "wm/imagined/swaps": float(tot["swaps"]),
            "wm/imagined/wm_version": float(oldest), "wm/publish_lag": float(trainer_version - oldest)}


class LocalImagination:
    """The imagination roles in the local runtime's one process: each `turn` ticks the world-model trainer (it feeds
    the recorded episodes, trains within its allowance, publishes to every imagination worker) and then one
    imagination producer. Deterministic."""

    def __init__(self, cfg, server, make_imagined_env, make_wm_trainer, make_latency=None, start_version: int = 0):
        """start_version: the learner's version when the run (or its resume) starts, as for the sim gate"""
        icfg, lc = cfg.imagination, cfg.learner
        self.pending: list[Episode] = []
        self.role = WMTrainerRole(make_wm_trainer, icfg, take=self._take_pending, publish=self._offer)
        n_imagined = icfg.imagined_per_batch(lc.batch_segments)
        # told what every update reached by the learner consumer, like the sim gate (learner.kl_stop)
        self.gate = StalenessGate(n_imagined, lc.steps_per_update, lc.max_staleness, start_version)
        self.queue = RolloutQueue(icfg.queue_capacity)
        self.workers = [ImaginationWorker(make_imagined_env, server, worker_id=IMAGINATION_WORKER_ID0 + w,
                                          gate=self.gate, **rollout_kwargs(cfg),
                                          latency=make_latency(IMAGINATION_WORKER_ID0 + w) if make_latency else None)
                        for w in range(icfg.num_workers)]
        # the queue never blocks here: turn() lets a producer tick only when its segments fit
        self.producers = [RolloutProducer(w, lambda seg: self.queue.put(seg, timeout_s=0)) for w in self.workers]
        self.mixer = SourceMixer(lc.batch_segments, n_imagined)
        self.record_fraction = icfg.record_fraction
        self._turn = 0

    def sink(self, episodes: list[Episode]) -> None:
        self.pending.extend(episodes)

    def _take_pending(self) -> list[Episode]:
        eps, self.pending = self.pending, []
        return eps

    def _offer(self, publication: dict[str, Any]) -> None:
        for w in self.workers:
            w.offer(publication)

    def wrap_env_factory(self, make_env):
        return RecordingEnvFactory(make_env, self.sink, self.record_fraction)

    def attach_sim_gate(self, sim_gate: StalenessGate) -> None:
        def on_shortfall(n: int) -> None:
            sim_gate.shift(-n)
            self.gate.shift(n)
        self.mixer.on_shortfall = on_shortfall

    def turn(self) -> list[dict[str, Any]]:
        self.role.tick()
        p = self.producers[self._turn % len(self.producers)]
        self._turn += 1
        # one process cannot block on a full queue: a worker collects only when its envs' segments fit
        # (one collect returns at most num_envs segments)
        if len(self.queue) + max(p.worker.num_envs, 1) <= self.queue.capacity:
            p.tick()
        return p.drain()[0]

    def take_batch(self, sim_queue: RolloutQueue) -> list[Segment] | None:
        """A mixed batch when the simulator queue can complete one now (never waits), else None."""
        if len(sim_queue) < self.mixer.sim_needed(len(self.queue)):
            return None
        return self.mixer.take(sim_queue.get_batch, lambda n: self.queue.get_batch(min(n, len(self.queue))))

    def stats(self) -> ImaginationStats:
        ws = [w.stats() for w in self.workers]
        return ImaginationStats(imagined_steps=sum(s.env_steps for s in ws), imagined_queue_size=len(self.queue),
                                wm={**self.role.metrics(), **imagination_metrics(ws, self.role.version)})

    def save_world_model(self, path) -> bool:
        return self.role.save(str(path))

    def close(self) -> None:
        for w in self.workers:
            w.close()
