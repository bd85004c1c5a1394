"""runtime: ray — one actor body for every role (acce/runtime/roles.py), the builders that make a role inside its
actor process, and the restart logic every Ray placement shares.

A role actor's constructor gets a picklable builder and builds the role where it runs; restartable roles (rollout
and imagination producers) find the run's server, queues and gate by name (ray_clients.named), so Ray can rebuild
them after a crash from the same arguments. `run` ticks the role until `stop`; `drain` and `state` answer from
another thread meanwhile.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

import ray

from acce.runtime.queue import put_all_until_stopped, put_until_stopped
from acce.runtime.ray_clients import RemoteGate, RemotePolicy, named, set_torch_threads, take_batch
from acce.runtime.roles import LearnerConsumer, RolloutProducer, rollout_kwargs

IDLE_PULL_S = 0.05
"""a worker with its own server whose every env waits on the gate asks the weight store for a newer version at most
this often (the learner's push covers the rest)"""


class RoleHost:
    """The body of every role actor: build the role where it runs, tick it until stop, drain it, snapshot it."""

    LOADS_TORCH = True
    """whether the role's process imports torch at start-up (ray_clients.set_torch_threads)"""

    def __init__(self, build: Callable[[Callable[[], bool]], Any], threads: int = 1, nice: int = 0):
        """build(stopped) -> the role; `stopped` says when a blocking put or take inside it should give up. nice:
        niceness added to this process (runtime.producer_nice), again in a process Ray restarts."""
        if nice:
            os.nice(nice)
        set_torch_threads(threads, load=self.LOADS_TORCH)
        self._stop = threading.Event()
        self.role = build(self._stop.is_set)

    def pid(self) -> int:
        return os.getpid()

    def incarnation(self) -> tuple[int, bool]:
        """(pid, whether Ray restarted this actor to get here): a restart during start-up has no old pid to differ
        from"""
        import warnings
        with warnings.catch_warnings():  # Ray's property uses its own deprecated actor_id internally
            warnings.simplefilter("ignore", DeprecationWarning)
            return os.getpid(), bool(ray.get_runtime_context().was_current_actor_reconstructed)

    @ray.method(concurrency_group="loop")
    def run(self, backoff_s: float = 0.0) -> None:
        """Tick until stop; a tick with nothing to do (every env waits on the gate) backs off `backoff_s`."""
        while not self._stop.is_set():
            if not self.role.tick() and backoff_s > 0:
                time.sleep(backoff_s)

    def stop(self) -> None:
        self._stop.set()

    def drain(self) -> Any:
        return self.role.drain()

    def state(self) -> dict[str, Any]:
        return self.role.state()

    def call(self, method: str, *args: Any) -> Any:
        """A role's own method (the learner's publish and policy_state, the world model's checkpoint bytes)."""
        return getattr(self.role, method)(*args)


# One class per kind of role, so `ray list actors` and process titles (ray::WorkerActor.run) say which is which.
# Rendering (MuJoCo's EGL context) must stay on one thread: `run` has a one-thread group, the other methods (drain,
# stop, pid) the default pool. On any pool thread, a second loop failed with EGL_BAD_ACCESS (the context was
# current on the thread of the first).
@ray.remote(max_restarts=-1, max_task_retries=0, concurrency_groups={"loop": 1})
class WorkerActor(RoleHost):
    """A simulator rollout producer (restartable)."""

    LOADS_TORCH = False  # MuJoCo and numpy only


@ray.remote(concurrency_groups={"loop": 1})
class LearnerActor(RoleHost):
    """The learner consumer."""


@ray.remote(max_restarts=-1, max_task_retries=0, concurrency_groups={"loop": 1})
class ImaginationActor(RoleHost):
    """An imagination producer (restartable)."""


@ray.remote(concurrency_groups={"loop": 1})
class WMTrainerActor(RoleHost):
    """The online world-model trainer."""


# --- restarts ------------------------------------------------------------------------------------------------------
def resubmit_dead(runs: dict[int, Any], handles: list, release: Callable[[int], None], timeout_s: float,
                  backoff_s: float) -> None:
    """Restartable roles: Ray restarts a dead process (max_restarts) but not the loop it ran. Submit each finished
    loop again; if its process died, first give what it was admitted for and never delivered back to the gate
    (`release(index)`; the restart itself is counted by its new pid when drained)."""
    for w, ref in list(runs.items()):
        if ray.wait([ref], timeout=0)[0]:
            try:
                ray.get(ref, timeout=timeout_s)
            except ray.exceptions.RayActorError:  # died (or still restarting): the new loop waits for the process
                release(w)
            runs[w] = handles[w].run.remote(backoff_s)


def ensure_running(ref, what: str, timeout_s: float) -> None:
    """A role that is not restartable (learner, world-model trainer) never returns while running: surface its
    error, or say that it stopped."""
    if ray.wait([ref], timeout=0)[0]:
        ray.get(ref, timeout=timeout_s)
        raise RuntimeError(f"the {what} stopped unexpectedly")


# --- builders (picklable; called inside the actor) ---------------------------------------------------------------
class BuildSimProducer:
    """A rollout worker over the run's training envs, paced by the named gate, into the named queue. Its inference:
    pipelined requests to the named server actor, or (own_server: runtime.inference_placement=worker) an
    in-process InferenceServer of its own, which the learner pushes every version to (`RolloutProducer.load_weights`)
    and which takes the named weight store's newest at start-up (a restart) and whenever the gate holds every env."""

    def __init__(self, worker_id: int, cfg, make_env, make_latency, names: dict[str, str], task_by_id: dict,
                 own_server: bool = False):
        self.worker_id, self.cfg, self.make_env, self.make_latency = worker_id, cfg, make_env, make_latency
        self.names, self.task_by_id, self.own_server = names, task_by_id, bool(own_server)

    def __call__(self, stopped: Callable[[], bool]) -> RolloutProducer:
        from acce.runtime.worker import RolloutWorker
        cfg, t = self.cfg, self.cfg.runtime.timeout_s
        queue = named(self.names["queue"], queue_maxsize=cfg.runtime.queue_capacity)
        env = self.make_env(self.worker_id)
        own, pull = self._own_server() if self.own_server else (None, None)
        policy = own if own is not None else RemotePolicy(named(self.names["server"]), t)
        worker = RolloutWorker(env, policy, worker_id=self.worker_id, gate=RemoteGate(named(self.names["gate"]), t),
                               pipelined=own is None, **rollout_kwargs(cfg),
                               latency=self.make_latency(self.worker_id) if self.make_latency else None)
        sampler = getattr(env, "task_sampler", None)

        def on_episode(ep: dict) -> None:  # this process's own curriculum (the driver keeps the logged one)
            if sampler is not None and hasattr(sampler, "update") and ep["task_id"] in self.task_by_id:
                sampler.update(self.task_by_id[ep["task_id"]], ep["success"])
        refresh = None
        if own is not None:
            last = [0.0]

            def refresh() -> None:  # a push lost to a restart: ask the store when the gate holds every env
                if worker.idle and time.monotonic() - last[0] >= IDLE_PULL_S:
                    last[0] = time.monotonic()
                    pull()
        return RolloutProducer(worker, lambda seg: put_until_stopped(queue, seg, stopped, t), on_episode=on_episode,
                               put_many=lambda segs: put_all_until_stopped(queue, segs, stopped, t), refresh=refresh,
                               own_server=own)

    def _own_server(self) -> tuple[Any, Callable[[], None]]:
        """The worker's in-process server (CPU, the shared server's settings), built from the store's base policy (a
        constructor argument that large would live in the object store, which a restart cannot count on: ray#53727),
        on the newest published weights; and `pull()`, which stages the store's newest version if the server is
        behind it."""
        from acce.policy.vla import VLAPolicy
        from acce.serving.inference import InferenceServer
        rt, store = self.cfg.runtime, named(self.names["weights"])
        base = ray.get(store.base.remote(), timeout=rt.timeout_s)
        server = InferenceServer(VLAPolicy.from_state(base), max_batch=rt.max_batch,
                                 timeout_ms=rt.timeout_ms, seed=self.cfg.run.seed + 7 + 1000 * (self.worker_id + 1),
                                 ship_features=self.cfg.learner.train_scope == "residual",
                                 backend=rt.inference_backend)

        def pull() -> None:
            if ray.get(store.latest_version.remote(), timeout=rt.timeout_s) > server.version:
                server.load_weights(*ray.get(store.get.remote(), timeout=rt.timeout_s))
        pull()  # a restarted worker resumes at the run's version, not at its start's
        return server, pull


class BuildLearner:
    """The learner consumer over the sim queue (or MixedBatches with imagination), publishing to the weight store
    and every server in one ray.put, reporting to the named gates."""

    def __init__(self, learner_state: dict, cfg, queue, servers: list, weight_store, gate_names: tuple[str, ...],
                 mixed=None, device: str = "cpu", push_to: list | tuple = ()):
        """gate_names: every stream's gate actor (sim; with imagination also the imagined one), each told what every
        update reached; device: 'cpu' or 'cuda' (acce.device.role_device), resolved where the actor runs; mixed:
        imagination on, ray_imagination.MixedBatches draws each batch from the sim and imagined queues; push_to: role
        actors with their own server (inference_placement=worker), sent every version beside the servers"""
        self.learner_state, self.cfg, self.queue, self.servers = learner_state, cfg, queue, servers
        self.push_to = tuple(push_to)
        self.weight_store, self.gate_names, self.mixed, self.device = weight_store, tuple(gate_names), mixed, device

    def __call__(self, stopped: Callable[[], bool]) -> LearnerConsumer:
        from acce.device import place, resolve_device
        from acce.policy.vla import VLAPolicy
        from acce.runtime.learner import make_learner
        cfg, t = self.cfg, self.cfg.runtime.timeout_s
        # placed before the optimizer exists, so its moments are built (and loaded) on the policy's device
        policy = place(VLAPolicy.from_state(self.learner_state["policy"]), resolve_device(self.device),
                       cfg.runtime.amp)
        learner = make_learner(policy, cfg.learner, seed=cfg.run.seed)
        learner.load_state_dict(self.learner_state)
        queue, servers, store, push_to = self.queue, self.servers, self.weight_store, self.push_to

        def publish(version: int, state: Any) -> None:
            ref = ray.put(state)  # one copy in the object store, zero-copy reads for every server
            pushed = [h.call.remote("load_weights", version, ref) for h in push_to]
            ray.get([store.publish.remote(version, ref)] + [s.load_weights.remote(version, ref) for s in servers],
                    timeout=t)
            if pushed:  # staged before the gate hears of the update; a worker that died takes the store's when back
                ray.wait(pushed, num_returns=len(pushed), timeout=t)

        def get_sim(n: int) -> list | None:
            return take_batch(queue, n, stopped, t)
        b, mixed = cfg.learner.batch_segments, self.mixed
        return LearnerConsumer(learner, (lambda: mixed.take(get_sim, learner.version)) if mixed is not None
                               else (lambda: get_sim(b)),
                               publish, [RemoteGate(named(name), t) for name in self.gate_names],
                               mix=mixed.metrics if mixed is not None else None, stamp_wait=True,
                               max_version=cfg.train.max_versions)
