"""Clients that rollout workers inside Ray actors use to reach the shared roles: a PolicyClient over the
InferenceServer actor (blocking `infer`, or pipelined `submit` -> RayPending) and a Gate over the gate actor. Every
remote wait is held to runtime.timeout_s."""
from __future__ import annotations

import ray


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
