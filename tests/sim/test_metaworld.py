"""Meta-World adapter: same single-env contract as our tabletop tasks (spaces, seeding, split step, expert)."""
import os

os.environ["MUJOCO_GL"] = "egl"  # before any mujoco import: headless rendering

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from gymnasium import spaces  # noqa: E402
from gymnasium.utils.env_checker import check_env  # noqa: E402

from sim.metaworld_env import (  # noqa: E402
    MetaWorldEnv,
    make_metaworld_env,
    metaworld_instruction,
    metaworld_task_names,
)

TASKS = ["reach-v3", "push-v3"]


@pytest.fixture
def make_env():
    """Factory that closes every env it built (EGL contexts must be freed explicitly)."""
    built = []

    def _make(name="reach-v3", **kwargs):
        env = make_metaworld_env(name, **kwargs)
        built.append(env)
        return env

    yield _make
    for env in built:
        env.close()


def _assert_obs_valid(env, obs):
    assert set(obs) == {"image/front", "state", "instruction"}
    img, state = obs["image/front"], obs["state"]
    assert img.dtype == np.uint8 and img.shape == (env.image_size, env.image_size, 3)
    assert state.dtype == np.float32 and state.shape == (env.state_dim,)
    assert np.all(np.isfinite(state))
    assert isinstance(obs["instruction"], str)
    assert env.observation_space.contains(obs)


@pytest.mark.parametrize("name", TASKS)
def test_spaces_and_dtypes(make_env, name):
    env = make_env(name)
    assert isinstance(env, MetaWorldEnv)
    assert env.task_name == f"metaworld/{name}"
    assert env.state_dim == 4 and env.action_dim == 4 and env.image_size == 64
    assert env.control_hz == pytest.approx(80.0)  # 1 / (frame_skip 5 * timestep 0.0025)
    assert env.max_episode_steps == 500
    space = env.observation_space
    assert isinstance(space, spaces.Dict)
    assert space["image/front"].shape == (64, 64, 3) and space["image/front"].dtype == np.uint8
    assert space["state"].shape == (4,) and space["state"].dtype == np.float32
    assert isinstance(space["instruction"], spaces.Text)
    assert env.action_space.shape == (4,) and env.action_space.dtype == np.float32
    np.testing.assert_array_equal(env.action_space.low, -1.0)
    np.testing.assert_array_equal(env.action_space.high, 1.0)

    obs, _ = env.reset(seed=0)
    _assert_obs_valid(env, obs)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    _assert_obs_valid(env, obs)
    assert isinstance(reward, float) and isinstance(terminated, bool) and isinstance(truncated, bool)
    assert isinstance(info["success"], bool)
    terms = info["reward_terms"]
    assert {"near_object", "grasp_reward", "in_place_reward", "obj_to_target"} <= set(terms)
    assert all(isinstance(v, float) for v in terms.values())


def test_state_is_proprio_only(make_env):
    env = make_env("push-v3")
    obs, _ = env.reset(seed=1)
    priv = env.privileged_obs
    np.testing.assert_allclose(obs["state"], priv[:4].astype(np.float32))
    # Hand xyz sits in the Sawyer workspace and the gripper opening is normalised to [0, 1].
    assert 0.0 <= obs["state"][3] <= 1.0


@pytest.mark.parametrize("name", TASKS)
def test_gymnasium_env_checker(make_env, name):
    env = make_env(name)
    check_env(env.unwrapped, skip_render_check=True)


def test_seed_selects_variation_deterministically(make_env):
    a, b = make_env("push-v3"), make_env("push-v3")
    obs_a, _ = a.reset(seed=42)
    obs_b, _ = b.reset(seed=42)
    np.testing.assert_array_equal(obs_a["image/front"], obs_b["image/front"])
    np.testing.assert_array_equal(obs_a["state"], obs_b["state"])
    np.testing.assert_array_equal(a.privileged_obs, b.privileged_obs)

    # Same seed after some steps on the same env: same start again.
    for _ in range(5):
        a.step_no_render(a.action_space.sample())
    again, _ = a.reset(seed=42)
    np.testing.assert_array_equal(again["image/front"], obs_a["image/front"])

    # A different seed moves the puck / goal, and the camera sees it.
    other, _ = b.reset(seed=43)
    assert not np.allclose(b.privileged_obs[4:7], a.privileged_obs[4:7])
    assert not np.array_equal(other["image/front"], obs_a["image/front"])


def test_no_nan_under_random_actions(make_env):
    env = make_env("push-v3")
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(60):
        reward, terminated, truncated, info = env.step_no_render(rng.uniform(-1, 1, 4).astype(np.float32))
        assert np.isfinite(reward)
        assert all(np.isfinite(v) for v in info["reward_terms"].values())
    _assert_obs_valid(env, env.observe())


def test_step_equals_step_no_render_then_observe(make_env):
    a, b = make_env("reach-v3"), make_env("reach-v3")
    a.reset(seed=7)
    b.reset(seed=7)
    rng = np.random.default_rng(1)
    for _ in range(10):
        action = rng.uniform(-1, 1, 4).astype(np.float32)
        obs_a, r_a, term_a, trunc_a, info_a = a.step(action)
        r_b, term_b, trunc_b, info_b = b.step_no_render(action)
        obs_b = b.observe()
        assert (r_a, term_a, trunc_a, info_a) == (r_b, term_b, trunc_b, info_b)
        np.testing.assert_array_equal(obs_a["image/front"], obs_b["image/front"])
        np.testing.assert_array_equal(obs_a["state"], obs_b["state"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expert_solves_reach(make_env, seed):
    env = make_env("reach-v3")
    env.reset(seed=seed)
    for step in range(env.max_episode_steps):
        action = env.expert_action()
        assert action.dtype == np.float32 and np.all(np.abs(action) <= 1.0)
        _, terminated, truncated, info = env.step_no_render(action)
        if terminated or truncated:
            break
    assert terminated and info["success"] and not truncated, f"expert failed on seed {seed} after {step + 1} steps"
    with pytest.raises(RuntimeError, match="reset"):  # an ended episode must be reset, not stepped
        env.step_no_render(np.zeros(4, np.float32))


def test_truncation_at_max_episode_steps(make_env):
    env = make_env("reach-v3", max_episode_steps=5)
    assert env.max_episode_steps == 5
    env.reset(seed=0)
    flags = [env.step_no_render(np.zeros(4, np.float32))[1:3] for _ in range(5)]
    assert flags == [(False, False)] * 4 + [(False, True)]
    env.reset()  # unseeded reset after truncation continues the seeded stream
    env.step_no_render(np.zeros(4, np.float32))


def test_camera_is_upright(make_env):
    # Meta-World's corner camera looks at the table with its "up" axis pointing at the floor; we roll it 180 deg.
    env = make_env("reach-v3")
    env.reset(seed=0)
    data = env._env.data
    up_world = data.cam_xmat[env._cam_id].reshape(3, 3)[:, 1]
    assert up_world[2] > 0


def test_bad_actions_and_order(make_env):
    env = make_env("reach-v3")
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(4, np.float32))
    with pytest.raises(RuntimeError, match="reset"):
        env.observe()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="finite"):
        env.step(np.array([0.0, np.nan, 0.0, 0.0], np.float32))
    with pytest.raises(ValueError, match="4 finite"):
        env.step(np.zeros(3, np.float32))


def test_names_and_instructions(make_env):
    names = metaworld_task_names()
    assert len(names) == 50 and "metaworld/reach-v3" in names and names == sorted(names)
    assert make_env("metaworld/reach-v3").task_name == "metaworld/reach-v3"
    with pytest.raises(ValueError, match="reach-v3"):
        make_metaworld_env("reech-v3")
    assert metaworld_instruction("reach-v3") == "reach the goal position"
    assert metaworld_instruction("metaworld/push-v3") == "push the puck to the goal"
    assert metaworld_instruction("pick-place-v3") == "pick up the puck and place it at the goal"
    assert metaworld_instruction("button-press-topdown-v3") == "button press topdown"
    text_space = make_env("reach-v3").observation_space["instruction"]
    assert all(text_space.contains(metaworld_instruction(n)) for n in names)


def test_render_mode_rgb_array(make_env):
    env = MetaWorldEnv("reach-v3", render_mode="rgb_array")
    try:
        obs, _ = env.reset(seed=0)
        np.testing.assert_array_equal(env.render(), obs["image/front"])
    finally:
        env.close()
        env.close()  # idempotent


def test_task_ids_are_stable_and_apart_from_tabletop(make_env):
    # acce keeps its own copy of the names (it must not import metaworld to map episode ids back to tasks)
    from acce.task_names import KNOWN_TASKS, METAWORLD_TASKS, TASK_BY_ID, task_id
    names = metaworld_task_names()
    assert tuple(n.removeprefix("metaworld/") for n in names) == METAWORLD_TASKS
    ids = [task_id(n) for n in names]
    assert ids == list(range(100, 150)) and not set(ids) & {task_id(t) for t in KNOWN_TASKS}
    assert all(TASK_BY_ID[i] == n for i, n in zip(ids, names))
    for name in ("reach-v3", "metaworld/push-v3"):
        env = make_env(name)
        assert env.task_id == task_id(env.task_name)
        _, info = env.reset(seed=0)
        assert info["task_id"] == env.task_id and env.step_no_render(np.zeros(4))[3]["task_id"] == env.task_id


def test_expert_action_noise(make_env):
    env = make_env("reach-v3")
    env.reset(seed=0)
    clean = env.expert_action()
    noisy = env.expert_action(0.3, np.random.default_rng(0))
    assert noisy.dtype == np.float32 and np.all(np.abs(noisy) <= 1.0) and not np.allclose(clean, noisy)


def test_in_the_vector_env():
    """The training/eval path: SimVectorEnv steps Meta-World slots, ids in obs and info, dims from the task."""
    from sim.vector_env import SimVectorEnv, task_config_from_params
    cfg = task_config_from_params("metaworld/reach-v3", {"max_steps": 6})
    venv = SimVectorEnv(["metaworld/reach-v3"], 2, image_size=16, task_configs={"metaworld/reach-v3": cfg})
    try:
        assert (venv.state_dim, venv.action_dim, venv.control_hz, venv.max_step_m) == (4, 4, 80.0, 0.01)
        obs = venv.reset(seeds=[0, 1])
        assert obs["state"].shape == (2, 4) and obs["image/front"].shape == (2, 16, 16, 3)
        np.testing.assert_array_equal(obs["task_id"], [140, 140])
        assert venv.task_names == ["metaworld/reach-v3"] * 2
        for t in range(6):
            step = venv.step(venv.expert_actions(0.1), render=t % 2 == 1)
        assert step.done.all() and list(step.info["task_id"]) == [140, 140]  # truncated at max_steps=6
        assert step.final_obs[0]["state"].shape == (4,)
    finally:
        venv.close()
    with pytest.raises(ValueError, match="share state_dim"):
        SimVectorEnv(["reach", "metaworld/reach-v3"], 1, image_size=16)
    with pytest.raises(ValueError, match="unknown field"):
        task_config_from_params("metaworld/reach-v3", {"ball_speed_mps": 1})


@pytest.mark.parametrize("name", TASKS)
def test_reward_is_meta_worlds_minus_its_maximum(make_env, name):
    """Success ends an episode here (not in Meta-World), so its 0..10 reward is shifted to -10..0: hovering just
    outside the success radius would otherwise pay ~9 a step for the rest of the episode, more than succeeding."""
    from sim.metaworld_env import MW_MAX_REWARD
    env = make_env(name)
    env.reset(seed=0)
    for _ in range(30):
        reward, terminated, truncated, info = env.step_no_render(env.expert_action())
        assert reward == pytest.approx(info["mw_reward"] - MW_MAX_REWARD) and reward <= 1e-9
        assert info["mw_reward"] > 0  # the expert's steps carry Meta-World's shaping
        if terminated or truncated:
            break
