"""runtime: ray — the roles (acce/runtime/roles.py) as Ray actors (embedded one-machine cluster, or
`runtime.address`); acce/runtime/ray_roles.py has the actor, the builders and the restart logic.

  rollout producers (restartable) --segments--> ray.util.queue.Queue (bounded: put blocks) --> learner consumer
  rollout producers --infer--> InferenceServer actor (threaded: concurrent requests merge into one batch), or with
  runtime.inference_placement=worker each producer's own in-process server (the learner pushes it every version)
  learner --publish (one ray.put, zero-copy)--> WeightStore actor + every InferenceServer (staged, swapped between
  batches); --consumed--> the gate actor (StalenessGate: async; SyncGate: sync, the same loops) and, with
  imagination, the imagined stream's gate actor
Every remote wait has a timeout (runtime.timeout_s) and fails loudly instead of hanging.
"""
from __future__ import annotations

import os
import time
import uuid
from typing import Any

import ray
from ray.util.queue import Queue

from acce.device import own_servers
from acce.runtime.ray_clients import ServerActor
from acce.runtime.ray_resources import ensure_ray, start_cluster  # noqa: F401 (ensure_ray: re-exported)
from acce.runtime.ray_roles import (BuildLearner, BuildSimProducer, LearnerActor, WorkerActor, ensure_running,
                                    resubmit_dead)
from acce.runtime.roles import (Drained, LearnerStats, ProducerStats, RuntimeStats, Tally, gate_spec, idle_frac,
                                rebase, retire_server, sum_server_stats)
from acce.runtime.weights import WeightStore
from acce.serving.inference import ServerStats

PRODUCER_BACKOFF_S = 0.005
"""a rollout producer whose every env waits for fresher weights sleeps this long before asking again"""
LEARNER_BACKOFF_S = 0.01
"""a learner with nothing to do (train.max_versions reached, or stopping) sleeps this long before its next tick"""


class RayRuntime:
    def __init__(self, cfg, learner, make_env, *, make_latency=None, on_episode=None, make_imagined_env=None,
                 make_wm_trainer=None):
        from acce.runtime.ray_imagination import RayImagination
        from acce.train import TASK_BY_ID
        rt = cfg.runtime
        device, learner_gpus, server_gpus = start_cluster(cfg, RayImagination.cpus(cfg))
        self.cfg, self.on_episode, self.timeout_s = cfg, on_episode, rt.timeout_s
        total_envs = cfg.rollout.num_workers * cfg.env.num_envs
        run_id = f"acce-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.names = {k: f"{run_id}/{k}" for k in ("server", "queue", "gate", "weights")}
        self.weight_store = ray.remote(WeightStore).options(num_cpus=0, name=self.names["weights"]).remote()
        self.own_servers = own_servers(rt.inference_placement, device)
        """every rollout worker runs its own in-process server; the shared one exists only for imagination"""
        self.server = None
        if not self.own_servers or cfg.imagination.enabled:
            # one thread per in-flight request: every env of every pipelined worker may have one
            self.server = ServerActor.options(num_cpus=rt.server_cpus, num_gpus=server_gpus, name=self.names["server"],
                                              max_concurrency=max(64, 2 * total_envs)).remote(
                learner.policy.policy_state(), rt.max_batch, rt.timeout_ms, cfg.run.seed + 7, rt.torch_threads,
                device, rt.amp, cfg.learner.train_scope == "residual", rt.inference_backend)
        self.queue = Queue(maxsize=rt.queue_capacity, actor_options={"num_cpus": 0, "name": self.names["queue"]})
        gate_cls, gate_args = gate_spec(cfg, total_envs, learner.version)
        self.gate = ray.remote(gate_cls).options(num_cpus=0, name=self.names["gate"]).remote(*gate_args)
        self.imagination = RayImagination(cfg, self.names["server"], make_imagined_env, make_wm_trainer, make_latency,
                                          learner.version) if cfg.imagination.enabled else None
        if self.imagination is not None:  # sim workers record real episodes for the world-model trainer
            make_env = self.imagination.wrap_env_factory(make_env)
        mixed = self.imagination.batches(self.gate) if self.imagination is not None else None
        # the learner tells every stream's gate what each update reached (learner.kl_stop may end one early)
        gate_names = (self.names["gate"],) + ((self.imagination.gate_name,) if self.imagination is not None else ())
        if self.own_servers:  # what the workers build their servers from (by name: they are restartable)
            ray.get(self.weight_store.set_base.remote(learner.policy.policy_state()), timeout=rt.timeout_s)
        self.workers = [WorkerActor.options(num_cpus=rt.worker_cpus, resources=dict(rt.worker_resources),
                                            max_concurrency=2).remote(
            BuildSimProducer(w, cfg, make_env, make_latency, self.names, TASK_BY_ID, self.own_servers), 1,
            rt.producer_nice)
            for w in range(cfg.rollout.num_workers)]
        self.learner = LearnerActor.options(num_cpus=rt.learner_cpus, num_gpus=learner_gpus,
                                            max_concurrency=2).remote(
            BuildLearner(learner.state_dict(), cfg, self.queue, [self.server] if self.server is not None else [],
                         self.weight_store, gate_names, mixed, device,
                         push_to=self.workers if self.own_servers else ()), rt.torch_threads)
        self.version = self.server_version = learner.version
        self._learner_stats = LearnerStats(version=learner.version)
        self._server_stats = ServerStats()
        self._worker_stats: dict[int, ProducerStats] = {}
        self._tallies: dict[int, Tally] = {}
        """env steps per worker across restarts (roles.rebase)"""
        self._retired_servers = ServerStats()
        """what the workers' dead processes' own servers counted (roles.retire_server)"""
        self._runs: dict[int, Any] = {}
        self._stopped = False
        self.restarts = 0
        """rollout workers that came back in a new process (seen by a changed pid)"""

    def start(self) -> None:
        # Actor start-up (imports, MuJoCo, the language model) is not a hang: wait for it with its own allowance
        # before every later call is held to runtime.timeout_s.
        ready = [h.incarnation.remote() for h in self.workers] + [self.learner.pid.remote()]
        ready += [self.server.version.remote()] if self.server is not None else []
        ready += self.imagination.ready_refs() if self.imagination is not None else []
        ready = ray.get(ready, timeout=self.cfg.runtime.startup_timeout_s)[:len(self.workers)]
        # the baseline a later restart is seen against; one that died while starting came back before ready
        self._tallies = {w: Tally(pid, 0) for w, (pid, _) in enumerate(ready)}
        self.restarts += sum(restarted for _, restarted in ready)
        ray.get(self.learner.call.remote("publish"), timeout=self.timeout_s)  # version 0 to every server first
        for w, h in enumerate(self.workers):
            self._runs[w] = h.run.remote(PRODUCER_BACKOFF_S)
        self._learner_run = self.learner.run.remote(LEARNER_BACKOFF_S)
        if self.imagination is not None:
            self.imagination.start()

    def _release(self, w: int) -> None:
        ray.get(self.gate.release_worker.remote(w), timeout=self.timeout_s)

    def poll(self) -> Drained:
        if not self._stopped:
            time.sleep(0.25)
            resubmit_dead(self._runs, self.workers, self._release, self.timeout_s, PRODUCER_BACKOFF_S)
            ensure_running(self._learner_run, "learner", self.timeout_s)
            if self.imagination is not None:
                self.imagination.check()
        updates, self._learner_stats = ray.get(self.learner.drain.remote(), timeout=self.timeout_s)
        self.version = self._learner_stats.version
        episodes = []
        for w, h in enumerate(self.workers):
            try:
                eps, st = ray.get(h.drain.remote(), timeout=self.timeout_s)
            except ray.exceptions.RayActorError:
                continue  # restarting; its episodes so far were already drained or died with it
            self._tallies[w], restarted = rebase(self._tallies.get(w), st.pid, st.env_steps)
            self.restarts += restarted
            if restarted and w in self._worker_stats:
                self._retired_servers = retire_server(self._retired_servers, self._worker_stats[w].inference)
            self._worker_stats[w] = st
            for ep in eps:
                if self.on_episode is not None:
                    self.on_episode(ep)
                episodes.append(ep)
        episodes += self.imagination.poll() if self.imagination is not None else []
        shared = ray.get([self.server.version.remote(), self.server.stats.remote()], timeout=self.timeout_s) \
            if self.server is not None else None
        if self.own_servers:  # the slowest worker's version is the lag that matters; counters summed
            own = [st for st in self._worker_stats.values() if st.inference is not None]
            self.server_version = min((st.policy_version for st in own), default=self.server_version)
            self._server_stats = sum_server_stats([self._retired_servers] + [st.inference for st in own]
                                                  + ([shared[1]] if shared else []))
        else:
            self.server_version, self._server_stats = shared
        return Drained(tuple(updates), tuple(episodes))

    def stats(self) -> RuntimeStats:
        ws, ls = self._worker_stats.values(), self._learner_stats
        return RuntimeStats(env_steps=sum(t.total for t in self._tallies.values()), learner_version=self.version,
                            server_version=self.server_version, queue_size=self.queue.size(),
                            queue_capacity=self.cfg.runtime.queue_capacity,
                            swap_ms=self._server_stats.swap_ms_last, server=self._server_stats,
                            workers=tuple(ws), restarts=self.restarts,
                            actor_idle_frac=idle_frac(sum(s.busy_s for s in ws), sum(s.alive_s for s in ws)),
                            learner_idle_frac=idle_frac(ls.busy_s, ls.alive_s),
                            imagination=self.imagination.stats() if self.imagination is not None else None)

    def learner_state(self) -> dict[str, Any]:
        return ray.get(self.learner.state.remote(), timeout=self.timeout_s)

    def policy_state(self) -> dict[str, Any]:
        return ray.get(self.learner.call.remote("policy_state"), timeout=self.timeout_s)

    def stop(self) -> Drained:
        """Stop producing and learning (the learner finishes its current update), then drain what is left."""
        if not self._stopped:
            ray.get([h.stop.remote() for h in self.workers] + [self.learner.stop.remote()], timeout=self.timeout_s)
            ray.get([self._learner_run] + list(self._runs.values()), timeout=self.timeout_s)
            if self.imagination is not None:
                self.imagination.stop()
        self._stopped = True
        return self.poll()

    def shutdown(self) -> None:
        try:
            for h in [*self.workers, self.learner]:
                h.stop.remote()
            time.sleep(0.1)
            if self.imagination is not None:
                self.imagination.shutdown()
            for h in [*self.workers, self.learner, self.server, self.gate, self.weight_store]:
                if h is not None:
                    ray.kill(h)
            self.queue.shutdown()
        except Exception:  # shutting down a broken cluster must not hide the original error
            pass
