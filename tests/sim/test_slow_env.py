import time

import numpy as np

from acce.runtime.worker import MeasuredLatency
from sim.slow_env import SlowStepEnv
from sim.vector_env import SimVectorEnv


def test_slow_env_waits_for_the_slowest_env_and_passes_everything_else_through():
    env = SlowStepEnv(SimVectorEnv(["reach"], 3, image_size=32), median_ms=5.0, sigma=0.0)
    try:
        env.reset()
        assert env.num_envs == 3 and env.action_dim == 4
        t0 = time.perf_counter()
        step = env.step(np.zeros((3, 4), np.float32), render=False)
        assert time.perf_counter() - t0 >= 0.005 and step.reward.shape == (3,)
        assert env.slept_s == 0.005
        env.step(np.zeros((3, 4), np.float32), render=False, active=np.zeros(3, bool))
        assert env.slept_s == 0.005  # nothing stepped, nothing waited
    finally:
        env.close()


def test_lognormal_tail_is_heavy():
    env = SlowStepEnv(None, median_ms=10.0, sigma=1.0, seed=0)
    draws = env.sample_ms(20000)
    assert abs(np.median(draws) - 10.0) < 0.5
    assert np.quantile(draws, 0.99) > 80  # p99 ~ 10 * e^(2.33) ~ 100 ms


def test_measured_latency_uses_the_previous_request():
    m = MeasuredLatency(control_hz=10.0)
    assert m.sample_steps() == 0
    m.observe(0.25)
    assert m.sample_steps() == 3
    m.observe(0.3)
    assert m.sample_steps() == 3  # 0.3 s * 10 Hz is 3 steps, not 4 (float noise)
