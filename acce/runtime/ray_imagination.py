"""runtime: ray — the imagination roles as Ray actors beside the sim workers (acce/runtime/imagination.py).

  sim producer env = RecordingEnv --_QueueSink: episode Queue (bounded; full: drop, count)--> world-model trainer
  trainer --publish (one ray.put)--> WeightStore actor (world-model versions) <--pull-- imagination producer(s)
  imagination producer (restartable) --infer--> the sim workers' InferenceServer; --segments--> imagined Queue
  learner consumer --MixedBatches: n_sim from the sim queue, then up to n_imagined imagined without waiting--> update

Imagination actors pull the latest publication, so a restarted one catches up by itself. Every remote wait has a
timeout (runtime.timeout_s; actor start-up runtime.startup_timeout_s).
"""
from __future__ import annotations

import os
import time
import uuid
from typing import Any

import ray
from ray.util.queue import Full, Queue

from acce.runtime.imagination import (IMAGINATION_WORKER_ID0, ImaginationWorker, RecordingEnvFactory,
                                      WMTrainerRole, imagination_metrics)
from acce.runtime.mixer import SourceMixer
from acce.runtime.queue import StalenessGate, put_all_until_stopped, put_until_stopped
from acce.runtime.ray_clients import named, queue_size, take_waiting
from acce.runtime.ray_roles import ImaginationActor, WMTrainerActor, ensure_running, resubmit_dead
from acce.runtime.roles import ImaginationStats, ProducerStats, RolloutProducer, Tally, rebase, rollout_kwargs
from acce.runtime.weights import WeightStore

IMAGINATION_BACKOFF_S = 0.05
"""no world model yet, or every env waits for fresher policy weights: each retry costs remote calls (gate, server
version), so imagination backs off longer than a sim worker and leaves it the CPU"""
TRAINER_BACKOFF_S = 0.1
"""nothing to learn from yet: the world-model trainer waits for episodes"""


class _QueueSink:
    """Picklable episode sink for RecordingEnv: never blocks a sim worker; a full queue drops the newest episode and
    counts it (the count travels with later episodes, per sink process)."""

    def __init__(self, queue_name: str, timeout_s: float):
        """queue_name: the episode queue's actor, looked up in the recording process (ray_clients.named: a sim
        worker that carries this sink must stay restartable)."""
        self.queue_name, self.timeout_s = queue_name, timeout_s
        self.dropped = 0
        self.sink_id: str | None = None
        self._actor = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_actor": None}  # a name travels, never a handle

    def __call__(self, episodes: list) -> None:
        self.sink_id = self.sink_id or uuid.uuid4().hex  # first call in this process: one id per worker process
        self._actor = self._actor or ray.get_actor(self.queue_name)
        for ep in episodes:
            try:
                ray.get(self._actor.put_nowait_batch.remote(
                    [{"episode": ep, "sink": self.sink_id, "dropped": self.dropped}]), timeout=self.timeout_s)
            except Full:
                self.dropped += 1


class MixedBatches:
    """Picklable batch source for the LearnerActor: a SourceMixer over the sim queue (the learner's own `get_sim`)
    and the imagined queue; a shortfall shifts both staleness gates."""

    def __init__(self, batch_segments: int, n_imagined: int, imagined_queue: Queue, sim_gate, imagined_gate,
                 timeout_s: float, max_staleness: int = -1):
        self.queue, self.sim_gate, self.imagined_gate = imagined_queue, sim_gate, imagined_gate
        self.timeout_s = timeout_s
        self.mixer = SourceMixer(batch_segments, n_imagined, on_shortfall=self._shortfall,
                                 max_staleness=max_staleness, on_stale=self._stale)

    def _shortfall(self, n: int) -> None:
        ray.get([self.sim_gate.shift.remote(-n), self.imagined_gate.shift.remote(n)], timeout=self.timeout_s)

    def _stale(self, n: int) -> None:
        ray.get(self.sim_gate.shift.remote(-n), timeout=self.timeout_s)

    def take(self, get_sim, version: int | None = None) -> list | None:
        """A mixed batch for the learner at `version` (over-stale imagined segments dropped, SourceMixer)."""
        return self.mixer.take(get_sim, lambda n: take_waiting(self.queue, n, self.timeout_s), version)

    def metrics(self, batch: list, learner_version: int) -> dict[str, float]:
        return self.mixer.metrics(batch, learner_version)


class BuildImaginationProducer:
    """An imagination worker that pulls the newest world model from the named store before each tick, paced by the
    imagined gate, into the imagined queue (all found by name: the actor is restartable)."""

    def __init__(self, worker_id: int, cfg, make_env, make_latency, names: dict[str, str]):
        """names: the server, imagined gate and queue, and world-model store actors by name (ray_clients.named)."""
        self.worker_id, self.cfg, self.make_env, self.make_latency, self.names = \
            worker_id, cfg, make_env, make_latency, names

    def __call__(self, stopped) -> RolloutProducer:
        from acce.runtime.ray_clients import RemoteGate, RemotePolicy
        cfg, t, names = self.cfg, self.cfg.runtime.timeout_s, self.names
        wm_store = named(names["wm_store"])
        queue = named(names["queue"], queue_maxsize=cfg.imagination.queue_capacity)
        worker = ImaginationWorker(self.make_env, RemotePolicy(named(names["server"]), t), worker_id=self.worker_id,
                                   gate=RemoteGate(named(names["gate"]), t), **rollout_kwargs(cfg),
                                   latency=self.make_latency(self.worker_id) if self.make_latency else None)
        seen = {"checked": 0.0, "offered": -1}

        def sync_wm() -> None:
            """Pull the newest world model (at most every 0.2 s); it is applied between control steps."""
            if time.time() - seen["checked"] < 0.2:
                return
            seen["checked"] = time.time()
            if ray.get(wm_store.latest_version.remote(), timeout=t) <= seen["offered"]:
                return
            version, (ref,) = ray.get(wm_store.get.remote(), timeout=t)
            worker.offer(ray.get(ref, timeout=t))
            seen["offered"] = version
        return RolloutProducer(worker, lambda seg: put_until_stopped(queue, seg, stopped, t), refresh=sync_wm,
                               put_many=lambda segs: put_all_until_stopped(queue, segs, stopped, t))


class BuildWMTrainer:
    """The world-model trainer over the episode queue (drop counts noted per sink), publishing to the store."""

    def __init__(self, cfg, make_trainer, episode_queue, wm_store):
        self.cfg, self.make_trainer, self.episode_queue, self.wm_store = cfg, make_trainer, episode_queue, wm_store

    def __call__(self, stopped) -> WMTrainerRole:
        t, queue, store = self.cfg.runtime.timeout_s, self.episode_queue, self.wm_store

        def take() -> list:
            items = take_waiting(queue, 256, t)
            for item in items:
                role.note_dropped(item["sink"], item["dropped"])
            return [item["episode"] for item in items]

        def publish(pub: dict) -> None:
            # the reference travels inside a list so the store keeps the reference, not a copy of the model
            ray.get(store.publish.remote(pub["version"], [ray.put(pub)]), timeout=t)
        role = WMTrainerRole(self.make_trainer, self.cfg.imagination, take=take, publish=publish)
        return role


class RayImagination:
    """Creates, starts, watches and drains the imagination roles for RayRuntime."""

    def __init__(self, cfg, server_name: str, make_imagined_env, make_wm_trainer, make_latency=None,
                 start_version: int = 0):
        """server_name: the run's inference server actor; this run's own actors are named next to it;
        start_version: the learner's version when the run (or its resume) starts, as for the sim gate."""
        icfg, lc, rt = cfg.imagination, cfg.learner, cfg.runtime
        self.cfg, self.timeout_s = cfg, rt.timeout_s
        self.n_imagined = icfg.imagined_per_batch(lc.batch_segments)
        run_id = server_name.rsplit("/", 1)[0]
        names = {"server": server_name, **{k: f"{run_id}/imagination/{k}" for k in
                                           ("wm_store", "queue", "episode_queue", "gate")}}
        self.wm_store = ray.remote(WeightStore).options(num_cpus=0, name=names["wm_store"]).remote()
        self.queue = Queue(maxsize=icfg.queue_capacity, actor_options={"num_cpus": 0, "name": names["queue"]})
        self.episode_queue = Queue(maxsize=icfg.episode_queue_capacity,
                                   actor_options={"num_cpus": 0, "name": names["episode_queue"]})
        # the learner reports what every update reached to this gate too, by name (learner.kl_stop)
        self.gate_name = names["gate"]
        self.gate = ray.remote(StalenessGate).options(num_cpus=0, name=names["gate"]).remote(
            self.n_imagined, lc.steps_per_update, lc.max_staleness, start_version)
        self.trainer = WMTrainerActor.options(num_cpus=icfg.trainer_cpus, num_gpus=icfg.trainer_gpus,
                                              max_concurrency=2).remote(
            BuildWMTrainer(cfg, make_wm_trainer, self.episode_queue, self.wm_store), rt.torch_threads)
        self.workers = [ImaginationActor.options(num_cpus=icfg.worker_cpus, max_concurrency=2).remote(
            BuildImaginationProducer(IMAGINATION_WORKER_ID0 + w, cfg, make_imagined_env, make_latency, names), 1,
            rt.producer_nice)
            for w in range(icfg.num_workers)]
        self.sink = _QueueSink(names["episode_queue"], rt.timeout_s)
        self._runs: dict[int, Any] = {}
        self._stats: dict[int, ProducerStats] = {}
        self._tallies: dict[int, Tally] = {}
        """imagined env steps per worker across restarts (roles.rebase)"""
        self.restarts = 0
        """imagination actors that came back in a new process (seen by a changed pid)"""
        self.metrics: dict[str, float] = {}

    @staticmethod
    def cpus(cfg) -> float:
        icfg = cfg.imagination
        return icfg.num_workers * icfg.worker_cpus + icfg.trainer_cpus if icfg.enabled else 0.0

    def wrap_env_factory(self, make_env):
        return RecordingEnvFactory(make_env, self.sink, self.cfg.imagination.record_fraction)

    def batches(self, sim_gate) -> MixedBatches:
        return MixedBatches(self.cfg.learner.batch_segments, self.n_imagined, self.queue, sim_gate, self.gate,
                            self.timeout_s, self.cfg.learner.max_staleness)

    def ready_refs(self) -> list:
        return [h.pid.remote() for h in [*self.workers, self.trainer]]

    def start(self) -> None:
        self._trainer_run = self.trainer.run.remote(TRAINER_BACKOFF_S)
        for w, h in enumerate(self.workers):
            self._runs[w] = h.run.remote(IMAGINATION_BACKOFF_S)

    def _release(self, w: int) -> None:
        ray.get(self.gate.release_worker.remote(IMAGINATION_WORKER_ID0 + w), timeout=self.timeout_s)

    def check(self) -> None:
        """Restart the loop of an imagination actor that Ray restarted; surface a world-model trainer error."""
        resubmit_dead(self._runs, self.workers, self._release, self.timeout_s, IMAGINATION_BACKOFF_S)
        ensure_running(self._trainer_run, "world-model trainer", self.timeout_s)

    def poll(self) -> list[dict]:
        episodes = []
        for w, h in enumerate(self.workers):
            try:
                eps, st = ray.get(h.drain.remote(), timeout=self.timeout_s)
            except ray.exceptions.RayActorError:
                continue  # restarting; it starts again from the latest publication
            self._tallies[w], restarted = rebase(self._tallies.get(w), st.pid, st.env_steps)
            self.restarts += restarted
            self._stats[w] = st
            episodes += eps
        wm = ray.get(self.trainer.drain.remote(), timeout=self.timeout_s)
        self.metrics = {**wm, **imagination_metrics([s.counters for s in self._stats.values()],
                                                    int(wm["wm/version"])),
                        "wm/imagination_restarts": float(self.restarts)}
        return episodes

    def stats(self) -> ImaginationStats:
        return ImaginationStats(imagined_steps=sum(t.total for t in self._tallies.values()),
                                imagined_queue_size=queue_size(self.queue, self.timeout_s), wm=dict(self.metrics))

    def stop(self) -> None:
        """Stop the loops and wait for them; a loop lost to an actor restart has nothing left to finish."""
        ray.get([self.trainer.stop.remote()], timeout=self.timeout_s)
        for w, ref in self._runs.items():
            try:
                ray.get(self.workers[w].stop.remote(), timeout=self.timeout_s)
                ray.get(ref, timeout=self.timeout_s)
            except ray.exceptions.RayActorError:
                pass
        ray.get(self._trainer_run, timeout=self.timeout_s)

    def save_world_model(self, path) -> bool:
        """Write the trainer's world model to `path` on the driver (atomically: temp file, then rename)."""
        data = ray.get(self.trainer.call.remote("to_bytes"), timeout=self.timeout_s)
        if data is None:
            return False
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True

    def shutdown(self) -> None:
        for h in [*self.workers, self.trainer]:
            h.stop.remote()
        time.sleep(0.05)
        for h in [*self.workers, self.trainer, self.gate, self.wm_store]:
            ray.kill(h)
        self.queue.shutdown()
        self.episode_queue.shutdown()
