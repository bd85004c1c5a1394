"""runtime: ray — the imagination roles as Ray actors beside the sim workers (acce/runtime/imagination.py).

  sim WorkerActor env = RecordingEnv --_QueueSink: episode Queue (bounded; full: drop, count)--> WMTrainerActor
  WMTrainerActor --publish (one ray.put)--> WeightStore actor (world-model versions) <--poll-- ImaginationActor(s)
  ImaginationActor (restartable) --infer--> the sim workers' InferenceServer;  --segments--> imagined Queue (bounded)
  LearnerActor --MixedBatches: n_sim from the sim queue, then up to n_imagined imagined without waiting--> update

Imagination actors pull the latest publication, so a restarted one catches up by itself. Every remote wait has a
timeout (runtime.timeout_s; actor start-up runtime.startup_timeout_s).
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid
from typing import Any

import ray
from ray.util.queue import Full, Queue

from acce.runtime.imagination import (IMAGINATION_WORKER_ID0, ImaginationWorker, RecordingEnvFactory,
                                      WMTrainerRole, imagination_metrics, rollout_kwargs)
from acce.runtime.mixer import SourceMixer
from acce.runtime.queue import StalenessGate
from acce.runtime.ray_clients import named, set_torch_threads
from acce.runtime.roles import ImaginationStats
from acce.runtime.weights import WeightStore


def _qsize(queue: Queue, timeout_s: float) -> int:
    return ray.get(queue.actor.qsize.remote(), timeout=timeout_s)


def _take_now(queue: Queue, n: int, timeout_s: float) -> list:
    """Up to n items that are already waiting (one consumer per queue, so the size cannot shrink in between)."""
    k = min(n, _qsize(queue, timeout_s))
    return ray.get(queue.actor.get_nowait_batch.remote(k), timeout=timeout_s) if k > 0 else []


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
                 timeout_s: float):
        self.queue, self.sim_gate, self.imagined_gate = imagined_queue, sim_gate, imagined_gate
        self.timeout_s = timeout_s
        self.mixer = SourceMixer(batch_segments, n_imagined, on_shortfall=self._shortfall)

    def _shortfall(self, n: int) -> None:
        ray.get([self.sim_gate.shift.remote(-n), self.imagined_gate.shift.remote(n)], timeout=self.timeout_s)

    def take(self, get_sim) -> list | None:
        return self.mixer.take(get_sim, lambda n: _take_now(self.queue, n, self.timeout_s))

    def metrics(self, batch: list, learner_version: int) -> dict[str, float]:
        return self.mixer.metrics(batch, learner_version)


@ray.remote(max_restarts=-1, max_task_retries=0)
class ImaginationActor:
    def __init__(self, worker_id: int, cfg, make_env, make_latency, names: dict[str, str]):
        """names: the server, imagined gate and queue, and world-model store actors by name (ray_clients.named)."""
        from acce.runtime.ray_clients import RemoteGate, RemotePolicy
        set_torch_threads(1)
        t = cfg.runtime.timeout_s
        server, gate, wm_store = named(names["server"]), named(names["gate"]), named(names["wm_store"])
        queue = named(names["queue"], queue_maxsize=cfg.imagination.queue_capacity)
        self.queue, self.wm_store, self.timeout_s = queue, wm_store, t
        self.worker = ImaginationWorker(make_env, RemotePolicy(server, t), worker_id=worker_id,
                                        gate=RemoteGate(gate, t), **rollout_kwargs(cfg),
                                        latency=make_latency(worker_id) if make_latency else None)
        self.stopped = False
        self.episodes: list[dict] = []
        self._checked = 0.0
        self._offered = -1

    def pid(self) -> int:
        return os.getpid()

    def _sync_wm(self) -> None:
        """Pull the newest world model (at most every 0.2 s); it is applied between control steps."""
        if time.time() - self._checked < 0.2:
            return
        self._checked = time.time()
        if ray.get(self.wm_store.latest_version.remote(), timeout=self.timeout_s) <= self._offered:
            return
        version, (ref,) = ray.get(self.wm_store.get.remote(), timeout=self.timeout_s)
        self.worker.offer(ray.get(ref, timeout=self.timeout_s))
        self._offered = version

    def run(self) -> int:
        while not self.stopped:
            self._sync_wm()
            segments = self.worker.collect(min_segments=1, max_steps=64)
            for ep in self.worker.drain_episodes():
                self.episodes.append({**ep, "worker_id": self.worker.worker_id})
            for seg in segments:
                self._put(seg)
            if not segments and self.worker.idle:
                # no world model yet, or every env waits for fresher policy weights: each retry costs remote calls
                # (gate, server version), so imagination backs off longer than a sim worker and leaves it the CPU
                time.sleep(0.05)
        return self.worker.wm_version

    def _put(self, seg) -> None:
        """Block while the imagined queue is full (pacing), in slices so that stop() is heard; fail after timeout_s."""
        deadline = time.time() + self.timeout_s
        while not self.stopped:
            try:
                self.queue.put(seg, timeout=1.0)
                return
            except Full:
                if time.time() > deadline:
                    raise TimeoutError(f"imagined queue stayed full for {self.timeout_s} s (is the learner alive?)")

    def stop(self) -> None:
        self.stopped = True

    def drain(self) -> dict:
        eps, self.episodes = self.episodes, []
        return {"episodes": eps, "stats": self.worker.stats(), "pid": os.getpid()}


@ray.remote
class WMTrainerActor:
    def __init__(self, cfg, make_trainer, episode_queue, wm_store, threads: int):
        set_torch_threads(threads)
        self.role = WMTrainerRole(make_trainer, cfg.imagination)
        self.episode_queue, self.wm_store, self.timeout_s = episode_queue, wm_store, cfg.runtime.timeout_s
        self.stopped = False
        self.lock = threading.Lock()
        """held by run() while it trains and publishes: a checkpoint never sees a half-applied optimizer step"""

    def ready(self) -> bool:
        return True

    def run(self) -> int:
        while not self.stopped:
            items = _take_now(self.episode_queue, 256, self.timeout_s)
            for item in items:
                self.role.note_dropped(item["sink"], item["dropped"])
            with self.lock:
                if items:
                    self.role.add_episodes([item["episode"] for item in items])
                trained = self.role.train()
                pub = self.role.publication()
            if pub is not None:
                # the reference travels inside a list so the store keeps the reference, not a copy of the model
                ray.get(self.wm_store.publish.remote(pub["version"], [ray.put(pub)]), timeout=self.timeout_s)
            if not trained and not items:
                time.sleep(0.1)  # nothing to learn from yet: wait for episodes
        return self.role.version

    def stop(self) -> None:
        self.stopped = True

    def metrics(self) -> dict[str, float]:
        with self.lock:
            return self.role.metrics()

    def checkpoint_bytes(self) -> bytes | None:
        """The world model as `WorldModel.save` writes it (the driver owns the run directory)."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "worldmodel.pt")
            with self.lock:
                saved = self.role.save(path)
            return open(path, "rb").read() if saved else None


class RayImagination:
    """Creates, starts, watches and drains the imagination actors for RayRuntime."""

    def __init__(self, cfg, server_name: str, make_imagined_env, make_wm_trainer, make_latency=None):
        """server_name: the run's inference server actor; this run's own actors are named next to it."""
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
        self.gate = ray.remote(StalenessGate).options(num_cpus=0, name=names["gate"]).remote(
            self.n_imagined, lc.steps_per_update, lc.max_staleness)
        self.trainer = WMTrainerActor.options(num_cpus=icfg.trainer_cpus, num_gpus=icfg.trainer_gpus,
                                              max_concurrency=2).remote(
            cfg, make_wm_trainer, self.episode_queue, self.wm_store, rt.torch_threads)
        self.workers = [ImaginationActor.options(num_cpus=icfg.worker_cpus, max_concurrency=2).remote(
            IMAGINATION_WORKER_ID0 + w, cfg, make_imagined_env, make_latency, names) for w in range(icfg.num_workers)]
        self.sink = _QueueSink(names["episode_queue"], rt.timeout_s)
        self._runs: dict[int, Any] = {}
        self._stats: dict[int, dict] = {}
        self._pids: dict[int, int] = {}
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
                            self.timeout_s)

    def ready_refs(self) -> list:
        return [h.pid.remote() for h in self.workers] + [self.trainer.ready.remote()]

    def start(self) -> None:
        self._trainer_run = self.trainer.run.remote()
        for w, h in enumerate(self.workers):
            self._runs[w] = h.run.remote()

    def check(self) -> None:
        """Restart the loop of an imagination actor that Ray restarted; surface a world-model trainer error."""
        for w, ref in list(self._runs.items()):
            done, _ = ray.wait([ref], timeout=0)
            if done:
                try:
                    ray.get(ref, timeout=self.timeout_s)
                except ray.exceptions.RayActorError:  # died (or still restarting): the loop is submitted again and
                    # waits for the new process; what it was admitted for and never delivered goes back to the gate
                    ray.get(self.gate.release_worker.remote(IMAGINATION_WORKER_ID0 + w), timeout=self.timeout_s)
                self._runs[w] = self.workers[w].run.remote()
        done, _ = ray.wait([self._trainer_run], timeout=0)
        if done:
            ray.get(self._trainer_run, timeout=self.timeout_s)
            raise RuntimeError("the world-model trainer stopped unexpectedly")

    def poll(self) -> list[dict]:
        episodes = []
        for w, h in enumerate(self.workers):
            try:
                d = ray.get(h.drain.remote(), timeout=self.timeout_s)
            except ray.exceptions.RayActorError:
                continue  # restarting; it starts again from the latest publication
            self.restarts += w in self._pids and self._pids[w] != d["pid"]
            self._pids[w] = d["pid"]
            prev = self._stats.get(w, {})
            base = prev.get("base", 0) + (prev.get("env_steps", 0) if d["stats"]["env_steps"] < prev.get(
                "env_steps", 0) else 0)  # a restarted actor counts from zero again
            self._stats[w] = {**d["stats"], "base": base}
            episodes += d["episodes"]
        wm = ray.get(self.trainer.metrics.remote(), timeout=self.timeout_s)
        self.metrics = {**wm, **imagination_metrics(list(self._stats.values()), int(wm["wm/version"])),
                        "wm/imagination_restarts": float(self.restarts)}
        return episodes

    def stats(self) -> ImaginationStats:
        return ImaginationStats(imagined_steps=sum(s["env_steps"] + s["base"] for s in self._stats.values()),
                                imagined_queue_size=_qsize(self.queue, self.timeout_s), wm=dict(self.metrics))

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
        data = ray.get(self.trainer.checkpoint_bytes.remote(), timeout=self.timeout_s)
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
