"""The batched VectorEnv contract (acce/types.py) as one reusable check, run on SimVectorEnv and ImaginedEnv."""
from __future__ import annotations

import numpy as np
import pytest

from acce.types import VectorEnv


def _check_batch(env, obs, n: int) -> None:
    for cam in env.camera_names:
        img = obs[f"image/{cam}"]
        assert img.dtype == np.uint8 and img.shape == (n, env.image_size, env.image_size, 3), img.shape
    assert obs["state"].dtype == np.float32 and obs["state"].shape == (n, env.state_dim)
    assert isinstance(obs["instruction"], list) and len(obs["instruction"]) == n
    assert all(isinstance(s, str) and s for s in obs["instruction"])
    assert obs["task_id"].dtype == np.int64 and obs["task_id"].shape == (n,)


def check_vector_env_contract(env, max_steps: int = 200, seed: int = 0) -> None:
    """Assert the batched env contract: shapes and dtypes, seeded resets, observe(indices), `active`, same-step
    autoreset with final_obs, and per-episode bookkeeping (length and return add up). Needs num_envs >= 2 and an
    env whose episodes end within `max_steps` steps of random actions."""
    assert isinstance(env, VectorEnv)
    n, a_dim = env.num_envs, env.action_dim
    assert n >= 2 and a_dim >= 1 and env.state_dim >= 1 and env.control_hz > 0 and env.camera_names
    rng = np.random.default_rng(seed)

    with pytest.raises(ValueError):
        env.reset(seeds=list(range(n + 1)))
    first = env.reset(seeds=list(range(100, 100 + n)))
    _check_batch(env, first, n)
    again = env.reset(seeds=list(range(100, 100 + n)))
    np.testing.assert_array_equal(first["state"], again["state"])  # a seed fixes the start state
    assert first["instruction"] == again["instruction"]

    sub = env.observe([1, 0])
    _check_batch(env, sub, 2)
    np.testing.assert_array_equal(sub["state"], again["state"][[1, 0]])
    assert sub["instruction"] == [again["instruction"][1], again["instruction"][0]]

    with pytest.raises(ValueError):
        env.step(np.zeros((n + 1, a_dim), np.float32))

    # An inactive env does not move and reports nothing.
    active = np.ones(n, bool)
    active[0] = False
    before = env.observe([0])
    step = env.step(rng.uniform(-1, 1, (n, a_dim)).astype(np.float32), render=True, active=active)
    _check_batch(env, step.obs, n)
    np.testing.assert_array_equal(step.obs["state"][0], before["state"][0])
    assert not step.done[0] and step.reward[0] == 0.0
    counts = np.where(active, 1, 0)
    returns = np.where(active, step.reward, 0.0).astype(np.float64)
    for i in np.flatnonzero(step.done):
        counts[i], returns[i] = 0, 0.0

    ended = 0
    for _ in range(max_steps):
        step = env.step(rng.uniform(-1, 1, (n, a_dim)).astype(np.float32), render=False)
        assert step.obs is None
        for name in ("reward", "terminated", "truncated", "success"):
            arr = getattr(step, name)
            assert arr.shape == (n,), name
        assert step.reward.dtype == np.float32 and step.terminated.dtype == bool and step.truncated.dtype == bool
        assert step.episode_success is not None and step.episode_success.shape == (n,)
        for key in ("episode_return", "episode_length", "task_id", "seed"):
            assert step.info[key].shape == (n,), key
        assert not (step.terminated & step.truncated).any()
        counts += 1
        returns += step.reward
        assert set(step.final_obs) == set(np.flatnonzero(step.done).tolist())
        for i in np.flatnonzero(step.done):
            final = step.final_obs[i]
            assert final["state"].shape == (env.state_dim,) and isinstance(final["instruction"], str)
            for cam in env.camera_names:
                assert final[f"image/{cam}"].shape == (env.image_size, env.image_size, 3)
            assert step.info["episode_length"][i] == counts[i]
            assert step.info["episode_return"][i] == pytest.approx(returns[i], rel=1e-4, abs=1e-4)
            counts[i], returns[i] = 0, 0.0
            ended += 1
        if ended >= 2:
            break
    assert ended >= 2, f"fewer than 2 episodes ended in {max_steps} steps"
    # Same-step autoreset: the next observation is a valid batch right away.
    _check_batch(env, env.observe(), n)
    env.close()
