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


def test_independent_envs_step_on_their_own_and_busy_envs_refuse_a_step():
    now = [0.0]  # virtual clock: only wait_ready() advances it, so machine load cannot change the outcome

    def sleep(s):
        now[0] += s
    env = SlowStepEnv(SimVectorEnv(["reach"], 3, image_size=32), median_ms=30.0, sigma=0.0, independent=True,
                      clock=lambda: now[0], sleep=sleep)
    try:
        env.reset()
        env.step(np.zeros((3, 4), np.float32), render=False, active=np.array([True, False, True]))
        assert now[0] == 0.0  # returns at once; envs 0 and 2 are now busy for 30 ms
        assert env.ready_mask().tolist() == [False, True, False]
        env.step(np.zeros((3, 4), np.float32), render=False, active=np.array([False, True, False]))  # env 1 free
        try:
            env.step(np.zeros((3, 4), np.float32), render=False, active=np.array([True, False, False]))
            raise AssertionError("stepping a busy env must fail")
        except RuntimeError as e:
            assert "still busy" in str(e)
        env.wait_ready()
        assert env.ready_mask()[[0, 2]].all() and abs(now[0] - 0.03) < 1e-9 and abs(env.slept_s - 0.03) < 1e-9
    finally:
        env.close()


def test_worker_keeps_fast_envs_going_while_one_env_is_slow():
    """A worker over independent slow envs steps each env as soon as it is ready: with env 0 fifty times slower
    than the others, the fast envs do many more steps in the same (virtual) time; lockstep gives equal counts."""
    from acce.runtime.worker import RolloutWorker

    class Policy:
        version = 0

        def infer(self, batch):
            n = len(batch["state"])
            return {"chunk": np.zeros((n, 4, 4), np.float32), "logp_pos": np.zeros((n, 4), np.float32),
                    "value": np.zeros(n, np.float32), "version": 0}

    def run(independent):
        now = [0.0]  # virtual clock: advances when the env sleeps and by 0.3 ms per reading (work takes time, so
        # envs free up between the worker's checks), never with the machine's speed

        def sleep(s):
            now[0] += s

        def clock():
            now[0] += 0.0003
            return now[0]
        env = SlowStepEnv(SimVectorEnv(["reach"], 3, image_size=32), median_ms=1.0, sigma=0.0,
                          independent=independent, clock=clock, sleep=sleep)
        env.sample_ms = lambda n: np.full(n, 0.45)  # frees up between two clock readings: the race a worker must handle
        counts = np.zeros(3, int)
        inner_step, outer_step = env.env.step, env.step

        def counting_step(actions, render=True, active=None):
            counts[np.asarray(active, bool)] += 1
            return inner_step(actions, render=render, active=active)

        def step(actions, render=True, active=None):  # env 0 takes 50 ms per step, the others 1 ms
            out = outer_step(actions, render=render, active=active)
            if independent and active[0]:
                env.busy_until[0] += 0.049
            elif not independent and active[0]:
                sleep(0.049)
            return out
        env.env.step, env.step = counting_step, step
        worker = RolloutWorker(env, Policy(), segment_len=1000, chunk_len=4, exec_horizon=4)
        try:
            while now[0] < 0.2:
                worker.collect(min_segments=1, max_steps=1)
        finally:
            worker.close()
        # every env executed only the first exec_horizon actions of each chunk: a decision per 4 steps per env (an
        # env stepped before its due decision ran on past its chunk and never asked for another one)
        assert worker.stats["decisions"] * 4 >= counts.sum(), (worker.stats, counts)
        return counts

    independent = run(True)
    assert 3 <= independent[0] <= 5 and (independent[1:] >= 100).all(), independent
    lockstep = run(False)
    assert (lockstep == lockstep[0]).all() and lockstep[0] <= 5, lockstep
