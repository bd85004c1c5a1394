"""Meta-World privileged aux labels: obs["aux"] = first object's xy, then the goal's xy, relative to the table
centre (reach: the goal's xy, then its height twice), read from the 39-d vector,
on request only, at reset, after steps and through the vector env's split step/observe."""
import os

os.environ["MUJOCO_GL"] = "egl"  # before any mujoco import: headless rendering

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from gymnasium.utils.env_checker import check_env  # noqa: E402

from sim.metaworld_env import make_metaworld_env  # noqa: E402
from sim.task import AUX_DIM  # noqa: E402

MW = "metaworld/reach-v3"


@pytest.fixture
def make_env():
    """Factory that closes every env it built (EGL contexts must be freed explicitly)."""
    built = []

    def _make(name="reach-v3", **kwargs):
        env = make_metaworld_env(name, image_size=16, **kwargs)
        built.append(env)
        return env

    yield _make
    for env in built:
        env.close()


def _expected(env) -> np.ndarray:
    """object xy then goal xy relative to the table centre (0, 0.6); reach (its puck is idle): goal xy, z, z"""
    priv = env.privileged_obs  # (39,): object position at [4:7], goal position at [36:39]
    if env.env_name == "reach-v3":
        return np.array([priv[36], priv[37] - 0.6, priv[38], priv[38]], np.float32)
    return np.array([priv[4], priv[5] - 0.6, priv[36], priv[37] - 0.6], np.float32)


@pytest.mark.parametrize("name", ["reach-v3", "push-v3"])
def test_aux_is_object_then_goal_xy_at_reset_and_after_steps(make_env, name):
    env = make_env(name, aux_labels=True)
    obs, _ = env.reset(seed=3)
    assert obs["aux"].shape == (AUX_DIM,) and obs["aux"].dtype == np.float32
    np.testing.assert_array_equal(obs["aux"], _expected(env))
    assert env.observation_space.contains(obs)
    for _ in range(5):
        obs, *_ = env.step(env.expert_action())
        np.testing.assert_array_equal(obs["aux"], _expected(env))
    env.step_no_render(env.expert_action())
    np.testing.assert_array_equal(env.observe()["aux"], _expected(env))  # the split path labels the same state
    # a new seed moves the goal, and the label with it
    first = env.reset(seed=3)[0]["aux"]
    assert not np.allclose(env.reset(seed=4)[0]["aux"][2:], first[2:])


def test_aux_only_on_request(make_env):
    env = make_env()
    obs, _ = env.reset(seed=0)
    assert "aux" not in obs and "aux" not in env.observation_space.spaces
    assert "aux" not in env.step(env.expert_action())[0]


def test_gymnasium_env_checker_with_aux(make_env):
    check_env(make_env(aux_labels=True).unwrapped, skip_render_check=True)


def test_vector_env_carries_aux_on_every_path():
    from sim.vector_env import SimVectorEnv, make_single_env, task_config_from_params
    cfg = task_config_from_params(MW, {"max_steps": 4})
    venv = SimVectorEnv([MW], 2, image_size=16, task_configs={MW: cfg}, aux_labels=True)
    try:
        obs = venv.reset(seeds=[0, 1])
        assert obs["aux"].shape == (2, AUX_DIM) and obs["aux"].dtype == np.float32
        np.testing.assert_array_equal(obs["aux"], np.stack([_expected(e) for e in venv.current]))
        for t in range(4):
            step = venv.step(venv.expert_actions(), render=t % 2 == 1)
        assert step.done.all() and step.final_obs[0]["aux"].shape == (AUX_DIM,)  # truncated at max_steps=4
        np.testing.assert_array_equal(venv.observe()["aux"], np.stack([_expected(e) for e in venv.current]))
    finally:
        venv.close()
    plain = make_single_env(MW, image_size=16)
    try:
        assert "aux" not in plain.reset(seed=0)[0]
    finally:
        plain.close()
