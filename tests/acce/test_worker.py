"""RolloutWorker's pipelined inference: requests go out without blocking, results are applied in order, and the
segments are the ones the blocking path builds. Also its gate re-asks and its counters (RolloutWorkerStats)."""
import concurrent.futures as cf
import contextlib
import dataclasses

import numpy as np
import pytest
import torch

from acce.config import load
from acce.serving.inference import InferenceServer
from acce.runtime.worker import FuturePending, RolloutWorker, RolloutWorkerStats
from sim.bandit import ContextualBanditEnv
from sim.vector_env import SimVectorEnv
from test_runtime import TINY, tiny_policy


class SlowPending:
    """Done only after it has been polled `polls` times (a request still on the server meanwhile)."""

    def __init__(self, result, polls):
        self.value, self.left = result, polls

    def done(self):
        self.left -= 1
        return self.left < 0

    def wait(self, timeout_s):
        self.left = -1
        return True

    def result(self):
        return self.value


class CountingPolicy:
    version = 5

    def __init__(self):
        self.submitted, self.infers = 0, 0

    def _reply(self, batch):
        n = len(batch["state"])
        return {"chunk": np.full((n, 4, 4), 0.1, np.float32), "logp_pos": np.zeros((n, 4), np.float32),
                "value": np.zeros(n, np.float32), "version": self.version}

    def infer(self, batch):
        self.infers += 1
        return self._reply(batch)

    def submit(self, batch):
        self.submitted += len(batch["state"])
        return SlowPending(self._reply(batch), polls=3)


def test_pipelined_worker_never_blocks_on_infer_and_applies_every_result():
    policy = CountingPolicy()
    worker = RolloutWorker(SimVectorEnv(["reach"], 3, image_size=32), policy, segment_len=2, chunk_len=4,
                           exec_horizon=4, pipelined=True)
    try:
        segments = worker.collect(min_segments=6)
        assert policy.infers == 0 and policy.submitted >= 6
        # every decision sent is applied or still in flight, none lost
        assert worker.stats.decisions + len(worker.inflight_envs) == policy.submitted
        assert len(segments) >= 6 and all((s.behavior_version == 5).all() for s in segments)
    finally:
        worker.close()


def test_pipelined_segments_equal_blocking_segments():
    """With deterministic actions, the pipelined path (the threaded server's submit) builds exactly the segments
    of the blocking path: same observations, actions, rewards, in the same per-env order."""
    cfg = load(None, TINY)

    def run(pipelined):
        server = InferenceServer(tiny_policy(cfg), deterministic=True)
        env = SimVectorEnv(["reach"], 3, image_size=32, seed=3)
        worker = RolloutWorker(env, server, segment_len=2, chunk_len=cfg.policy.chunk_len, exec_horizon=4,
                               max_delay=cfg.policy.max_delay_steps, pipelined=pipelined)
        try:
            return worker.collect(min_segments=9)
        finally:
            server.stop()
            worker.close()
    torch.manual_seed(0)
    a, b = run(False), run(True)
    by_env = lambda segs: {e: sorted((s for s in segs if s.env_index == e), key=lambda s: int(s.env_step[0]))  # noqa: E731
                           for e in range(3)}
    ea, eb = by_env(a), by_env(b)
    compared = 0
    for e in range(3):
        for sa, sb in zip(ea[e], eb[e]):
            np.testing.assert_array_equal(sa.env_step, sb.env_step)
            np.testing.assert_array_equal(sa.obs["state"], sb.obs["state"])
            np.testing.assert_allclose(sa.chunk, sb.chunk, atol=1e-5)
            np.testing.assert_array_equal(sa.reward, sb.reward)
            compared += 1
    assert compared >= 6


def test_future_pending_times_out_loudly():
    fut = cf.Future()
    pending = FuturePending(fut, timeout_s=0.05)
    assert not pending.done() and not pending.wait(0.01)
    with pytest.raises(TimeoutError, match="inference server alive"):
        pending.wait(None)
    fut.set_result({"x": 1})
    assert pending.done() and pending.result() == {"x": 1}


class CountingGate:
    """Admits nothing until `open_at` version; counts every ask."""

    def __init__(self, open_at):
        self.open_at, self.asks = open_at, 0

    def try_acquire(self, worker_id, env_index, version):
        self.asks += 1
        return version >= self.open_at


@contextlib.contextmanager
def gated_worker(monkeypatch, retry_s, open_at, num_envs):
    """A reset worker on CountingPolicy (version 5) behind a CountingGate, with GATE_RETRY_S = retry_s."""
    import acce.runtime.worker as wmod
    monkeypatch.setattr(wmod, "GATE_RETRY_S", retry_s)
    policy, gate = CountingPolicy(), CountingGate(open_at=open_at)
    worker = RolloutWorker(SimVectorEnv(["reach"], num_envs, image_size=32), policy, segment_len=2, chunk_len=4,
                           exec_horizon=4, gate=gate)
    try:
        worker.env.reset()
        yield policy, gate, worker
    finally:
        worker.close()


def test_a_denied_env_is_not_asked_again_until_the_version_changes(monkeypatch):
    with gated_worker(monkeypatch, 60.0, open_at=6, num_envs=2) as (policy, gate, worker):
        for _ in range(20):  # every env paused at version 5: one denial each, then no more asks
            worker._decide([])
        assert gate.asks == 2 and worker.paused.all() and worker.stats.gate_asks == 2
        policy.version = 6  # new weights: asked again, admitted
        worker._decide([])
        assert gate.asks == 4 and not worker.paused.any()


def test_a_denial_expires_after_the_retry_interval_even_at_the_same_version(monkeypatch):
    with gated_worker(monkeypatch, 0.0, open_at=99, num_envs=1) as (_, gate, worker):
        for _ in range(3):
            worker._decide([])
        assert gate.asks == 3


class LateLatency:
    """Every request takes 3 control steps: more than max_delay = 0, so every decision's delay is clamped."""

    def sample_steps(self):
        return 3


def test_stats_are_frozen_snapshots_that_count_by_hand():
    """3 bandit envs whose episodes are 4 steps = one chunk (chunk_len = exec_horizon = 4); segments of 2 decisions.
    8 control steps: every env steps at every step (3 x 8 = 24 env steps, 0 paused), decides at t = 0 and t = 4
    (3 x 2 = 6 decisions, each delay clamped from 3 to 0), ends 2 episodes (6), and its 2nd decision, closed by the
    end of its 2nd episode, completes one segment (3)."""
    worker = RolloutWorker(ContextualBanditEnv(3, steps=4), CountingPolicy(), segment_len=2, chunk_len=4,
                           exec_horizon=4, latency=LateLatency())
    try:
        before = worker.stats
        segments = worker.collect(min_segments=99, max_steps=8)
        after = worker.stats
        assert before == RolloutWorkerStats()  # a snapshot: the steps since did not change it
        assert (after.env_steps, after.paused_steps, after.decisions, after.delay_clamped, after.segments,
                after.gate_asks) == (24, 0, 6, 6, 3, 0)
        assert len(segments) == 3 and len(worker.drain_episodes()) == 6
        assert after.env_time_s > 0 and after.render_time_s > 0 and after.infer_time_s > 0
        assert after["env_steps"] == 24 and after.get("restarts", 0) == 0  # read by key, as the dict it replaced
        with pytest.raises(dataclasses.FrozenInstanceError):
            after.env_steps = 0
        worker.collect(min_segments=99, max_steps=4)  # a 3rd episode each: 12 more env steps, 3 more decisions
        assert after.env_steps == 24 and (worker.stats.env_steps, worker.stats.decisions) == (36, 9)
    finally:
        worker.close()
