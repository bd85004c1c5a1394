"""A RolloutWorker over ImaginedEnv is an imagination worker: same code path as sim workers, source='imagined'."""
from wm_helpers import CountingPolicy, fake_episode, tiny_model

from acce.runtime.worker import RolloutWorker
from worldmodel.imagined_env import ImaginedEnv

CHUNK = 4


def _worker(wm_version: int = 3) -> tuple[RolloutWorker, CountingPolicy]:
    env = ImaginedEnv(tiny_model(), 2, start_episodes=[fake_episode(6, k) for k in range(3)], horizon=5,
                      wm_version=wm_version)
    policy = CountingPolicy(CHUNK, version=7)
    return RolloutWorker(env, policy, segment_len=3, chunk_len=CHUNK, exec_horizon=2, source="imagined"), policy


def test_imagination_worker_builds_imagined_segments():
    worker, policy = _worker()
    segments = worker.collect(min_segments=2, max_steps=200)
    assert len(segments) >= 2 and policy.rows > 0
    for seg in segments:
        assert seg.source == "imagined" and len(seg) == 3
        assert seg.obs["image/front"].shape == (3, 32, 32, 3) and seg.obs["state"].shape == (3, 7)
        assert (seg.behavior_version == 7).all()
    episodes = worker.drain_episodes()
    assert episodes and all(ep["source"] == "imagined" and 1 <= ep["length"] <= 5 for ep in episodes)


def test_imagined_segments_carry_the_wm_version():
    worker, _ = _worker(wm_version=3)
    segments = worker.collect(min_segments=1, max_steps=200)
    assert all((seg.wm_version == 3).all() for seg in segments)
