"""The InferenceServer as a Ray actor, and the clients that rollout workers inside Ray actors use to reach the shared
roles: a PolicyClient over the server actor (blocking `infer`, or pipelined `submit` -> RayPending) and a Gate over
the gate actor. Every remote wait is held to runtime.timeout_s. Restartable actors find the shared roles by name
(`named`), never by a handle passed to their constructor."""
from __future__ import annotations

import os
from typing import Any

import ray
from ray.util.queue import Queue

from acce.serving.inference import InferenceServer, ServerStats


def set_torch_threads(n: int, load: bool = True) -> None:
    """Each actor process gets its own torch thread count (the default would claim every core per process).
    load=False (a rollout worker, which steps MuJoCo and numpy only) does not import torch for this when nothing has:
    the count goes to OMP_NUM_THREADS, which torch reads if something imports it later. Importing torch cost each
    rollout worker seconds of CPU while the learner and the server were importing theirs (docs/decisions.md). Roles
    that run torch on several threads import it here, on the actor's main thread, before any method runs."""
    import sys
    if load or "torch" in sys.modules:
        import torch
        torch.set_num_threads(max(1, n))
    else:
        os.environ["OMP_NUM_THREADS"] = str(max(1, n))


@ray.remote
class ServerActor:
    def __init__(self, policy_state: dict, max_batch: int, timeout_ms: float, seed: int, threads: int,
                 device: str = "cpu", amp: bool = False, ship_features: bool = False, backend: str = "torch"):
        """device: 'cpu' or 'cuda' (acce.device.role_device), resolved here, where the actor runs; ship_features:
        InferenceServer's (learner.train_scope=residual); backend: runtime.inference_backend."""
        from acce.device import place, resolve_device
        from acce.policy.vla import VLAPolicy
        set_torch_threads(threads)
        policy = place(VLAPolicy.from_state(policy_state), resolve_device(device), amp)
        self.server = InferenceServer(policy, max_batch=max_batch, timeout_ms=timeout_ms, seed=seed,
                                      ship_features=ship_features, backend=backend)
        self.server.start()

    def infer(self, batch: dict) -> dict:
        return self.server.submit(batch).result(timeout=120)

    def load_weights(self, version: int, state: Any) -> None:
        self.server.load_weights(version, state)

    def version(self) -> int:
        return self.server.version

    def stats(self) -> ServerStats:
        return self.server.stats  # a frozen snapshot: pickles to the driver


def named(name: str, queue_maxsize: int | None = None):
    """Look up a run's shared actor by name inside a restartable actor. Restartable actors get names, not handles:
    Ray cannot guarantee a restart whose constructor arguments hold actor handles or object refs (ray#53727) and
    logs an ERROR line for every such actor; a name is a plain string, and the named actor lives as long as the
    driver that owns it (the run). With queue_maxsize, the actor is a ray.util.queue.Queue's and the thin Queue
    wrapper is rebuilt around it."""
    handle = ray.get_actor(name)
    if queue_maxsize is None:
        return handle
    queue = Queue.__new__(Queue)
    queue.maxsize, queue.actor = queue_maxsize, handle
    return queue


def queue_size(queue, timeout_s: float) -> int:
    """Items waiting in a ray.util.queue.Queue now (one round trip)."""
    return ray.get(queue.actor.qsize.remote(), timeout=timeout_s)


def take_waiting(queue, n: int, timeout_s: float) -> list:
    """Up to n items already waiting in a ray.util.queue.Queue, in two round trips whatever n (size, then one batch);
    its one consumer is the caller, so the size cannot shrink in between."""
    k = min(n, queue_size(queue, timeout_s))
    return ray.get(queue.actor.get_nowait_batch.remote(k), timeout=timeout_s) if k > 0 else []


def take_batch(queue, n: int, stopped, timeout_s: float) -> list | None:
    """n items from a ray.util.queue.Queue in FIFO order, or None if `stopped()` first (the run is ending: a partial
    batch is dropped, as before batching). Blocks (waking each second to see a stop) for one item, then takes whatever
    else is waiting in one batch: a few round trips per update instead of one per segment."""
    batch: list = []
    while len(batch) < n and not stopped():
        try:
            batch.append(queue.get(timeout=1.0))
        except Exception:  # ray.util.queue.Empty after the timeout: check stop, keep waiting
            continue
        batch += take_waiting(queue, n - len(batch), timeout_s)
    return batch if len(batch) == n else None


class RemotePolicy:
    """PolicyClient over a ServerActor handle (used inside worker actors)."""

    def __init__(self, handle, timeout_s: float):
        self.handle, self.timeout_s = handle, timeout_s

    @property
    def version(self) -> int:
        return ray.get(self.handle.version.remote(), timeout=self.timeout_s)

    def infer(self, batch: dict) -> dict:
        return ray.get(self.handle.infer.remote(batch), timeout=self.timeout_s)

    def submit(self, batch: dict) -> "RayPending":
        return RayPending(self.handle.infer.remote(batch), self.timeout_s)


class RayPending:
    """worker.Pending over an ObjectRef: a pipelined worker keeps stepping its other envs while this is in flight."""

    def __init__(self, ref, timeout_s: float):
        self.ref, self.timeout_s = ref, timeout_s

    def done(self) -> bool:
        return bool(ray.wait([self.ref], timeout=0)[0])

    def wait(self, timeout_s: float | None) -> bool:
        done = bool(ray.wait([self.ref], timeout=self.timeout_s if timeout_s is None else timeout_s)[0])
        if timeout_s is None and not done:
            raise TimeoutError(f"no inference result within runtime.timeout_s={self.timeout_s} s (is the inference "
                               "server alive?)")
        return done

    def result(self) -> dict:
        return ray.get(self.ref, timeout=self.timeout_s)


class RemoteGate:
    def __init__(self, handle, timeout_s: float):
        self.handle, self.timeout_s = handle, timeout_s

    def try_acquire(self, worker_id: int, env_index: int, version: int) -> bool:
        return ray.get(self.handle.try_acquire.remote(worker_id, env_index, version), timeout=self.timeout_s)

    def try_acquire_many(self, worker_id: int, env_indices: list[int], version: int) -> list[bool]:
        return ray.get(self.handle.try_acquire_many.remote(worker_id, list(env_indices), version),
                       timeout=self.timeout_s)

    def consumed(self, updates: int, version: int) -> None:
        """Fire and forget: the gate only grows more permissive with the report (a SyncGate opens the next round),
        and a late one keeps the StalenessGate's predictions upper bounds."""
        self.handle.consumed.remote(updates, version)
