"""SlowStepEnv: a vector env whose every step also waits an extra wall-clock latency from a heavy-tailed
distribution, as with remote simulators or real robots (the long-tail case of `acce bench throughput`).

Two ways to step the envs of one vector env, both real wall-clock:

* lockstep (`independent=False`): a step waits for the slowest of its envs — the sleep is the maximum of one
  lognormal draw per active env, as a synchronous vectorized env does;
* independent (`independent=True`): each env is its own remote process. A step returns at once and the stepped
  envs stay busy for their own latency; `ready_mask()` says which envs may be stepped or observed again and
  `wait_ready()` sleeps until the next one frees up. A rollout worker steps only ready envs (docs/design.md §1: one
  slow env does not hold back the others).
"""
from __future__ import annotations

import time

import numpy as np


class SlowStepEnv:
    def __init__(self, env, median_ms: float, sigma: float, seed: int = 0, independent: bool = False,
                 clock=time.monotonic, sleep=time.sleep):
        """clock/sleep: injectable for deterministic tests (a virtual clock that advances only when slept)."""
        if median_ms < 0 or sigma < 0:
            raise ValueError("step latency median_ms and sigma must be >= 0")
        self.env, self.median_ms, self.sigma, self.independent = env, median_ms, sigma, independent
        self.clock, self.sleep = clock, sleep
        self.rng = np.random.default_rng(seed)
        self.slept_s = 0.0
        """lockstep: total time step() slept; independent: total time wait_ready() slept"""
        self.busy_until = np.zeros(env.num_envs if env is not None else 0)
        """independent: self.clock() at which each env's last step completes"""

    def __getattr__(self, name):  # everything else is the wrapped env's
        return getattr(self.env, name)

    def sample_ms(self, n: int) -> np.ndarray:
        return self.median_ms * np.exp(self.sigma * self.rng.standard_normal(n))

    def ready_mask(self) -> np.ndarray:
        """(N,) bool: envs whose last step has completed (always all of them in lockstep mode)."""
        return self.busy_until <= self.clock()

    def seconds_until_ready(self) -> float:
        """Wall-clock seconds until the next env frees up (0 if one is ready now)."""
        return max(float(self.busy_until.min()) - self.clock(), 0.0) if self.busy_until.size else 0.0

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Sleep until at least one env is ready (at most timeout_s)."""
        delay = min(float(self.busy_until.min()) - self.clock(), timeout_s)
        if delay > 0:
            self.sleep(delay)
            self.slept_s += delay

    def step(self, actions, render: bool = True, active=None):
        mask = np.ones(self.env.num_envs, bool) if active is None else np.asarray(active, bool)
        n = int(mask.sum())
        if n and self.median_ms > 0:
            delays_s = self.sample_ms(n) / 1000.0
            if self.independent:
                now = self.clock()
                busy = np.flatnonzero(mask & (self.busy_until > now))
                if busy.size:
                    raise RuntimeError(f"envs {busy.tolist()} are still busy with their previous step; step only "
                                       "envs where ready_mask() is True")
                self.busy_until[mask] = now + delays_s
            else:
                self.sleep(float(delays_s.max()))
                self.slept_s += float(delays_s.max())
        return self.env.step(actions, render=render, active=active)
