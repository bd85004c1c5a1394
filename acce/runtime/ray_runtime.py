"""runtime: ray — the same plain roles as Ray actors (embedded one-machine cluster, or `runtime.address`).

  RolloutWorker actors (restartable) --segments--> ray.util.queue.Queue (bounded: put blocks) --> Learner actor
  RolloutWorker --infer--> InferenceServer actor (threaded: concurrent requests merge into one batch)
  Learner --publish (one ray.put, zero-copy)--> WeightStore actor + every InferenceServer (staged, swapped
  between batches)
Every remote wait has a timeout (runtime.timeout_s) and fails loudly instead of hanging.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

import ray
from ray.util.queue import Queue

from acce.runtime.queue import StalenessGate, SyncGate, put_until_stopped
from acce.runtime.ray_clients import RemoteGate, RemotePolicy, ServerActor, named, set_torch_threads
from acce.runtime.ray_resources import ensure_ray, start_cluster  # noqa: F401 (ensure_ray: re-exported)
from acce.runtime.weights import WeightStore
from acce.runtime.worker import RolloutWorker


# Rendering (MuJoCo's EGL context) must stay on one thread: run and collect_round share a one-thread group, the
# other methods (drain, stop, pid) the default pool. On any pool thread, a second collect_round failed with
# EGL_BAD_ACCESS (the context was current on the thread of the first).
@ray.remote(max_restarts=-1, max_task_retries=0, concurrency_groups={"env": 1})
class WorkerActor:
    def __init__(self, worker_id: int, cfg, make_env, make_latency, names: dict[str, str], task_by_id: dict):
        """names: the run's server, gate and queue actors by name (see `named`)."""
        set_torch_threads(1)
        r, lc = cfg.rollout, cfg.learner
        server, gate = named(names["server"]), named(names["gate"])
        queue = named(names["queue"], queue_maxsize=cfg.runtime.queue_capacity)
        self.cfg, self.queue, self.task_by_id = cfg, queue, task_by_id
        env = make_env(worker_id)
        self.worker = RolloutWorker(env, RemotePolicy(server, cfg.runtime.timeout_s), worker_id=worker_id,
                                    segment_len=r.segment_len, chunk_len=cfg.policy.chunk_len,
                                    exec_horizon=r.execution_horizon, max_delay=cfg.policy.max_delay_steps,
                                    gamma=lc.gamma, delay_aware=lc.delay_correction,
                                    latency=make_latency(worker_id) if make_latency else None,
                                    gate=RemoteGate(gate, cfg.runtime.timeout_s), pipelined=True)
        self.stopped = False
        self.episodes: list[dict] = []
        self.idle_s = 0.0
        self.busy_s = 0.0
        """time producing (stepping envs, rendering, waiting for inference); idle = gate pauses, full queue, barrier"""
        self.started: float | None = None

    def pid(self) -> int:
        return os.getpid()

    def incarnation(self) -> tuple[int, bool]:
        """(pid, whether Ray restarted this actor to get here): a restart during start-up has no old pid to differ
        from"""
        import warnings
        with warnings.catch_warnings():  # Ray's property uses its own deprecated actor_id internally
            warnings.simplefilter("ignore", DeprecationWarning)
            return os.getpid(), bool(ray.get_runtime_context().was_current_actor_reconstructed)

    def _note_episodes(self) -> None:
        sampler = getattr(self.worker.env, "task_sampler", None)
        for ep in self.worker.drain_episodes():
            ep["worker_id"] = self.worker.worker_id
            if sampler is not None and hasattr(sampler, "update") and ep["task_id"] in self.task_by_id:
                sampler.update(self.task_by_id[ep["task_id"]], ep["success"])
            self.episodes.append(ep)

    def _collect(self, n: int, max_steps: int | None = None) -> list:
        self.started = self.started or time.time()
        t0 = time.perf_counter()
        out = self.worker.collect(min_segments=n, max_steps=max_steps)
        self.busy_s += time.perf_counter() - t0
        return out

    @ray.method(concurrency_group="env")
    def run(self) -> int:
        """Produce segments forever (until stop); each one goes into the queue whole or not at all."""
        while not self.stopped:
            segments = self._collect(1, max_steps=64)
            self._note_episodes()
            for seg in segments:
                t0 = time.perf_counter()
                put_until_stopped(self.queue, seg, lambda: self.stopped, self.cfg.runtime.timeout_s)
                self.idle_s += time.perf_counter() - t0
            if not segments and self.worker.paused.all():
                t0 = time.perf_counter()
                time.sleep(0.005)  # every env waits for fresher weights (staleness pacing)
                self.idle_s += time.perf_counter() - t0
        return self.worker.stats["segments"]

    @ray.method(concurrency_group="env")
    def collect_round(self) -> list:
        """Sync mode: one segment per env with the round's weights."""
        segments = []
        while len(segments) < self.worker.env.num_envs:
            segments += self._collect(self.worker.env.num_envs - len(segments))
            if self.worker.paused.all() and len(segments) < self.worker.env.num_envs:
                time.sleep(0.002)
        self._note_episodes()
        return segments

    def stop(self) -> None:
        self.stopped = True

    def drain(self) -> dict:
        eps, self.episodes = self.episodes, []
        return {"episodes": eps, "stats": dict(self.worker.stats), "idle_s": self.idle_s, "busy_s": self.busy_s,
                "alive_s": time.time() - self.started if self.started else 0.0, "pid": os.getpid()}


@ray.remote
class LearnerActor:
    def __init__(self, learner_state: dict, cfg, queue, servers: list, weight_store, threads: int, mixed=None,
                 device: str = "cpu"):
        """device: 'cpu' or 'cuda' (acce.device.role_device), resolved here, where the actor runs."""
        from acce.device import place, resolve_device
        from acce.policy.vla import VLAPolicy
        from acce.runtime.learner import make_learner
        set_torch_threads(threads)
        self.cfg, self.queue, self.servers, self.weight_store = cfg, queue, servers, weight_store
        self.mixed = mixed
        """imagination on: ray_imagination.MixedBatches draws each batch from the sim and imagined queues"""
        # placed before the optimizer exists, so its moments are built (and loaded) on the policy's device
        policy = place(VLAPolicy.from_state(learner_state["policy"]), resolve_device(device), cfg.runtime.amp)
        self.learner = make_learner(policy, cfg.learner, seed=cfg.run.seed)
        self.learner.load_state_dict(learner_state)
        self.updates0 = self.learner.updates  # the gate counts this run's updates (a resume starts a new gate)
        # run() holds this while it updates and publishes; snapshots (checkpoints, evaluation) wait for it, so they
        # never see a half-applied optimizer step
        self.lock = threading.Lock()
        self.stopped = False
        self.updates: list[dict] = []
        self.wait_s = 0.0
        self.busy_s = 0.0
        self.started: float | None = None

    def publish(self) -> int:
        ref = ray.put(self.learner.trainable_state())
        v = self.learner.version
        ray.get([self.weight_store.publish.remote(v, ref)] + [s.load_weights.remote(v, ref) for s in self.servers],
                timeout=self.cfg.runtime.timeout_s)
        return v

    def update(self, segments: list) -> dict:
        self.started = self.started or time.time()
        t0 = time.perf_counter()
        out = self.learner.update(segments)
        self.publish()
        self.busy_s += time.perf_counter() - t0
        return out

    def _get_sim(self, n: int) -> list | None:
        batch = []
        while len(batch) < n and not self.stopped:
            try:
                batch.append(self.queue.get(timeout=1.0))
            except Exception:  # ray.util.queue.Empty after the timeout: check stop, keep waiting
                continue
        return batch if len(batch) == n else None

    def run(self) -> int:
        b = self.cfg.learner.batch_segments
        self.started = self.started or time.time()
        while not self.stopped:
            t0 = time.perf_counter()
            batch = self.mixed.take(self._get_sim) if self.mixed is not None else self._get_sim(b)
            self.wait_s += time.perf_counter() - t0
            if batch is None:
                break
            with self.lock:
                t1 = time.perf_counter()
                mix = self.mixed.metrics(batch, self.learner.version) if self.mixed is not None else {}
                upd = {**self.learner.update(batch), **mix}
                upd["queue/learner_wait_s"] = self.wait_s
                self.updates.append(upd)
                self.publish()
                self.busy_s += time.perf_counter() - t1
        return self.learner.version

    def stop(self) -> None:
        self.stopped = True

    def ready(self) -> bool:
        return True

    def drain(self) -> dict:
        ups, self.updates = self.updates, []
        return {"updates": ups, "version": self.learner.version, "updates_done": self.learner.updates - self.updates0,
                "wait_s": self.wait_s, "busy_s": self.busy_s,
                "alive_s": time.time() - self.started if self.started else 0.0}

    def state_dict(self) -> dict:
        with self.lock:
            return self.learner.state_dict()

    def policy_state(self) -> dict:
        with self.lock:
            return self.learner.policy.policy_state()


class RayRuntime:
    def __init__(self, cfg, learner, make_env, *, make_latency=None, on_episode=None, make_imagined_env=None,
                 make_wm_trainer=None):
        from acce.runtime.ray_imagination import RayImagination
        from acce.train import TASK_BY_ID
        rt = cfg.runtime
        device, learner_gpus, server_gpus = start_cluster(cfg, RayImagination.cpus(cfg))
        self.cfg, self.on_episode = cfg, on_episode
        self.sync = rt.mode == "sync"
        lc, t = cfg.learner, rt.timeout_s
        policy_state = learner.policy.policy_state()
        total_envs = cfg.rollout.num_workers * cfg.env.num_envs
        self.weight_store = ray.remote(WeightStore).options(num_cpus=0).remote()
        # one thread per in-flight request: every env of every pipelined worker may have one
        run_id = f"acce-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.names = {k: f"{run_id}/{k}" for k in ("server", "queue", "gate")}
        self.server = ServerActor.options(num_cpus=rt.server_cpus, num_gpus=server_gpus, name=self.names["server"],
                                          max_concurrency=max(64, 2 * total_envs)).remote(
            policy_state, rt.max_batch, rt.timeout_ms, cfg.run.seed + 7, rt.torch_threads, device, rt.amp,
            lc.train_scope == "residual")
        self.queue = Queue(maxsize=rt.queue_capacity, actor_options={"num_cpus": 0, "name": self.names["queue"]})
        gate_cls = SyncGate if self.sync else StalenessGate
        gate_args = ((total_envs,) if self.sync else
                     (lc.batch_segments, lc.steps_per_update, lc.max_staleness, learner.version))
        self.gate = ray.remote(gate_cls).options(num_cpus=0, name=self.names["gate"]).remote(*gate_args)
        self.imagination = RayImagination(cfg, self.names["server"], make_imagined_env, make_wm_trainer, make_latency) \
            if cfg.imagination.enabled else None
        if self.imagination is not None:  # sim workers record real episodes for the world-model trainer
            make_env = self.imagination.wrap_env_factory(make_env)
        self.learner = LearnerActor.options(num_cpus=rt.learner_cpus, num_gpus=learner_gpus,
                                            max_concurrency=2).remote(
            learner.state_dict(), cfg, self.queue, [self.server], self.weight_store, rt.torch_threads,
            self.imagination.batches(self.gate) if self.imagination is not None else None, device)
        self.workers = [WorkerActor.options(num_cpus=rt.worker_cpus, resources=dict(rt.worker_resources),
                                            max_concurrency=2).remote(
            w, cfg, make_env, make_latency, self.names, TASK_BY_ID)
            for w in range(cfg.rollout.num_workers)]
        self.timeout_s = t
        self.version = learner.version
        self.server_version = learner.version
        self.env_steps = 0
        self._worker_stats: dict[int, dict] = {}
        self._runs: dict[int, Any] = {}
        self._pids: dict[int, int] = {}
        self.restarts = 0
        """rollout workers that came back in a new process (seen by a changed pid)"""

    def start(self) -> None:
        # Actor start-up (imports, MuJoCo, the language model) is not a hang: wait for it with its own allowance
        # before every later call is held to runtime.timeout_s.
        ready = [h.incarnation.remote() for h in self.workers] + [self.server.version.remote(),
                                                                   self.learner.ready.remote()]
        ready += self.imagination.ready_refs() if self.imagination is not None else []
        ready = ray.get(ready, timeout=self.cfg.runtime.startup_timeout_s)[:len(self.workers)]
        self._pids = {w: pid for w, (pid, _) in enumerate(ready)}  # the baseline a later restart is seen against
        self.restarts += sum(restarted for _, restarted in ready)  # died while starting, came back before ready
        ray.get(self.learner.publish.remote(), timeout=self.timeout_s)  # version 0 to every server first
        if self.sync:
            ray.get(self.gate.open_round.remote(self.version), timeout=self.timeout_s)
            return
        for w, h in enumerate(self.workers):
            self._runs[w] = h.run.remote()
        self._learner_run = self.learner.run.remote()
        if self.imagination is not None:
            self.imagination.start()

    def _check_workers(self) -> None:
        """A worker whose process died is restarted by Ray (max_restarts); start its loop again."""
        for w, ref in list(self._runs.items()):
            done, _ = ray.wait([ref], timeout=0)
            if done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:  # (counted by its new pid in poll(), which also sees
                    # restarts during start-up) what it was admitted for and never delivered goes back to the gate
                    if not self.sync:
                        ray.get(self.gate.release_worker.remote(w), timeout=self.timeout_s)
                self._runs[w] = self.workers[w].run.remote()
        done, _ = ray.wait([self._learner_run], timeout=0)
        if done:
            ray.get(self._learner_run)  # the learner never returns while running: surface its error
            raise RuntimeError("the learner stopped unexpectedly")
        if self.imagination is not None:
            self.imagination.check()

    def poll(self) -> dict[str, Any]:
        updates: list[dict] = []
        if self.sync:
            segments: list = []
            while True:  # rounds with the same weights until the batch is full: sync learns from batches as large
                # as async's (learner.batch_segments), not from one segment per env
                rounds = ray.get([w.collect_round.remote() for w in self.workers], timeout=self.timeout_s)
                segments += [s for r in rounds for s in r]
                if len(segments) >= self.cfg.learner.batch_segments:
                    break
                ray.get(self.gate.open_round.remote(self.version), timeout=self.timeout_s)
            updates.append(ray.get(self.learner.update.remote(segments), timeout=self.timeout_s))
            self._learner_times = ray.get(self.learner.drain.remote(), timeout=self.timeout_s)
            self.version = self._learner_times["version"]
            ray.get(self.gate.open_round.remote(self.version), timeout=self.timeout_s)
        else:
            if not getattr(self, "_stopped", False):
                time.sleep(0.25)
                self._check_workers()
            d = ray.get(self.learner.drain.remote(), timeout=self.timeout_s)
            updates, self.version = d["updates"], d["version"]
            self._learner_times = d
            # what the updates really reached (learner.kl_stop may end one early); fire and forget, as the gate only
            # grows more permissive with it and a late report keeps predictions upper bounds
            self.gate.consumed.remote(d["updates_done"], d["version"])
        episodes = []
        for w, h in enumerate(self.workers):
            try:
                d = ray.get(h.drain.remote(), timeout=self.timeout_s)
            except ray.exceptions.RayActorError:
                continue  # restarting; its episodes so far were already drained or died with it
            if w in self._pids and d["pid"] != self._pids[w]:  # a new process: Ray restarted this worker
                self.restarts += 1
            self._pids[w] = d["pid"]
            prev = self._worker_stats.get(w, {}).get("env_steps", 0)
            if d["stats"]["env_steps"] < prev:  # a restarted worker counts from zero again
                self._worker_stats[w] = {"env_steps": 0, "base": self._worker_stats[w].get("base", 0) + prev}
            base = self._worker_stats.get(w, {}).get("base", 0)
            self._worker_stats[w] = {**d["stats"], "base": base, "busy_s": d["busy_s"], "alive_s": d["alive_s"]}
            for ep in d["episodes"]:
                if self.on_episode is not None:
                    self.on_episode(ep)
                episodes.append(ep)
        episodes += self.imagination.poll() if self.imagination is not None else []
        self.server_version, self._server_stats = ray.get([self.server.version.remote(), self.server.stats.remote()],
                                                          timeout=self.timeout_s)
        return {"updates": updates, "episodes": episodes}

    def stats(self) -> dict[str, Any]:
        lt = getattr(self, "_learner_times", {})
        env_steps = sum(s.get("env_steps", 0) + s.get("base", 0) for s in self._worker_stats.values())
        return {"env_steps": env_steps, "learner_version": self.version, "server_version": self.server_version,
                "queue_size": self.queue.size(), "queue_capacity": self.cfg.runtime.queue_capacity,
                "swap_ms": getattr(self, "_server_stats", {}).get("swap_ms_last", 0.0),
                "server": dict(getattr(self, "_server_stats", {})),
                "worker_stats": list(self._worker_stats.values()), "restarts": self.restarts,
                "actor_idle_frac": 1.0 - sum(s.get("busy_s", 0.0) for s in self._worker_stats.values()) / max(
                    sum(s.get("alive_s", 0.0) for s in self._worker_stats.values()), 1e-9),
                "learner_idle_frac": 1.0 - lt.get("busy_s", 0.0) / max(lt.get("alive_s", 0.0), 1e-9),
                **(self.imagination.stats() if self.imagination is not None else {})}

    def learner_state(self) -> dict[str, Any]:
        return ray.get(self.learner.state_dict.remote(), timeout=self.timeout_s)

    def policy_state(self) -> dict[str, Any]:
        return ray.get(self.learner.policy_state.remote(), timeout=self.timeout_s)

    def stop(self) -> dict[str, Any]:
        """Stop producing and learning (the learner finishes its current update), then drain what is left."""
        if not self.sync:
            ray.get([h.stop.remote() for h in self.workers] + [self.learner.stop.remote()], timeout=self.timeout_s)
            ray.get([self._learner_run] + list(self._runs.values()), timeout=self.timeout_s)
            if self.imagination is not None:
                self.imagination.stop()
        self._stopped = True
        return self.poll()

    def shutdown(self) -> None:
        try:
            for h in self.workers:
                h.stop.remote()
            self.learner.stop.remote()
            time.sleep(0.1)
            if self.imagination is not None:
                self.imagination.shutdown()
            for h in [*self.workers, self.learner, self.server, self.gate, self.weight_store]:
                ray.kill(h)
            self.queue.shutdown()
        except Exception:  # shutting down a broken cluster must not hide the original error
            pass
