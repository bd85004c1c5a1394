"""SlowStepEnv: a vector env whose every step also waits an extra wall-clock latency from a heavy-tailed
distribution, as with remote simulators or real robots (the long-tail case of `acce bench throughput`).

The envs of one vector env are stepped in lockstep, so a step waits for the slowest of them: the sleep is the
maximum of one lognormal draw per active env.
"""
from __future__ import annotations

import time

import numpy as np


class SlowStepEnv:
    def __init__(self, env, median_ms: float, sigma: float, seed: int = 0):
        if median_ms < 0 or sigma < 0:
            raise ValueError("step latency median_ms and sigma must be >= 0")
        self.env, self.median_ms, self.sigma = env, median_ms, sigma
        self.rng = np.random.default_rng(seed)
        self.slept_s = 0.0

    def __getattr__(self, name):  # everything else is the wrapped env's
        return getattr(self.env, name)

    def sample_ms(self, n: int) -> np.ndarray:
        return self.median_ms * np.exp(self.sigma * self.rng.standard_normal(n))

    def step(self, actions, render: bool = True, active=None):
        n = self.env.num_envs if active is None else int(np.sum(active))
        if n and self.median_ms > 0:
            delay_s = float(self.sample_ms(n).max()) / 1000.0
            time.sleep(delay_s)
            self.slept_s += delay_s
        return self.env.step(actions, render=render, active=active)
