"""WeightStore: the versioned source of truth for policy weights.

Every actor starts from the same version-0 weights (published before any rollout). Only trainable parameters and
the buffers needed to reproduce outputs are published (the frozen language model never travels).
"""
from __future__ import annotations

import threading
from typing import Any


class WeightStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = -1
        self._state: Any = None
        self._base: Any = None
        self.publishes = 0

    def publish(self, version: int, state: Any) -> None:
        """state: a dict of numpy arrays (local) or an object reference to one (ray). Versions only move forward."""
        with self._lock:
            if version < self._version:
                raise ValueError(f"publish of version {version} after {self._version}: versions only move forward")
            self._version, self._state = int(version), state
            self.publishes += 1

    def set_base(self, policy_state: Any) -> None:
        """The whole policy the run started from (VLAPolicy.policy_state, frozen parts included): what a process that
        serves the policy itself builds it from before it takes the newest published version (Ray: restartable
        rollout workers with their own server get it here, not in their constructor arguments)."""
        with self._lock:
            self._base = policy_state

    def base(self) -> Any:
        with self._lock:
            if self._base is None:
                raise RuntimeError("no base policy: the runtime sets it before it starts workers that serve themselves")
            return self._base

    def latest_version(self) -> int:
        return self._version

    def get(self) -> tuple[int, Any]:
        with self._lock:
            if self._version < 0:
                raise RuntimeError("no weights published yet; the runtime publishes version 0 before rollouts start")
            return self._version, self._state
