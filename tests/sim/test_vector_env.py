import numpy as np
import pytest

from acce.types import VectorEnv
from sim.task import TEST_SEEDS
from sim.vector_env import SimVectorEnv


@pytest.fixture
def venv():
    env = SimVectorEnv(["reach", "track"], 4, image_size=32, seed=0)
    yield env
    env.close()


def test_batched_shapes_and_contract(venv):
    assert isinstance(venv, VectorEnv)
    obs = venv.reset()
    assert obs["image/front"].shape == (4, 32, 32, 3) and obs["state"].shape == (4, 7)
    assert len(obs["instruction"]) == 4 and obs["task_id"].shape == (4,)
    step = venv.step(np.zeros((4, 4), np.float32), render=False)
    assert step.obs is None and step.reward.shape == (4,)
    sub = venv.observe([2, 0])
    assert sub["image/front"].shape == (2, 32, 32, 3)
    np.testing.assert_array_equal(sub["state"][1], venv.observe([0])["state"][0])


def test_autoreset_reports_final_obs_and_episode_stats(venv):
    venv.reset()
    for _ in range(60):
        step = venv.step(venv.expert_actions(), render=True)
        if step.done.any():
            break
    done = np.flatnonzero(step.done)
    assert done.size > 0
    for i in done:
        assert i in step.final_obs and step.episode_success[i]
        assert step.info["episode_length"][i] > 0
        # the new episode starts fresh: its first observation is already in obs
        assert venv.lengths[i] == 0


def test_test_seed_range_and_explicit_seeds():
    env = SimVectorEnv(["reach"], 2, image_size=32, seed_range=TEST_SEEDS, seed=1)
    env.reset()
    assert all(s in TEST_SEEDS for s in env.seeds)
    a = env.reset(seeds=[5, 6])
    b = env.reset(seeds=[5, 6])
    np.testing.assert_array_equal(a["image/front"], b["image/front"])
    env.close()


def test_wrong_action_shape_is_an_error(venv):
    venv.reset()
    with pytest.raises(ValueError, match="shape"):
        venv.step(np.zeros((3, 4), np.float32))


def test_floor_rendering_grid_is_coarse():
    """A plane's size[2] is its rendering grid spacing; at 0.01 m the 4 x 4 m floor was a 400 x 400 grid that made
    every 64 x 64 software-GL frame 6.8x slower (2.5 ms vs 0.37 ms, same image to one intensity level)."""
    from sim.vector_env import make_single_env
    env = make_single_env("reach", image_size=32)
    m = env.scene.model
    floor = m.geom("floor").id
    cells = (2 * m.geom_size[floor, 0] / m.geom_size[floor, 2]) * (2 * m.geom_size[floor, 1] / m.geom_size[floor, 2])
    assert cells <= 40 * 40
    env.close()


def test_aux_labels_reach_recorded_episodes_only_when_asked():
    from acce.store.recorder import EpisodeRecorder
    from sim.vector_env import make_single_env

    env = SimVectorEnv(["push", "reach"], 2, image_size=16, aux_labels=True)
    obs = env.reset()
    assert obs["aux"].shape == (2, 4)
    rec = EpisodeRecorder(2, source="demo")
    rec.start_all(obs, env.task_names, env.seeds)
    episodes = []
    while len(episodes) < 2:
        actions = env.expert_actions()
        episodes += rec.add(actions, env.step(actions), next_tasks=env.task_names, next_seeds=env.seeds)
    for ep in episodes:  # one label row per observation frame, final frame included
        assert ep.obs["aux"].shape == (ep.num_steps + 1, 4)
    env.close()
    plain = SimVectorEnv(["push"], 1, image_size=16)
    assert "aux" not in plain.reset()
    plain.close()
    mw = make_single_env("metaworld/reach-v3", image_size=16, aux_labels=True)  # Meta-World records them too
    assert mw.reset(seed=0)[0]["aux"].shape == (4,)
    mw.close()


def test_privileged_state_view_appends_positions_and_blanks_images():
    """The sanity ladder's state-only view: state = proprioception + the instruction's object/goal xy, no pixels."""
    from acce.wiring import make_sim_env
    env = make_sim_env(["reach"], 2, image_size=32, privileged_state=True)
    try:
        obs = env.reset()
        assert env.state_dim == 11 and obs["state"].shape == (2, 11)
        np.testing.assert_array_equal(obs["state"][:, 7:], obs["aux"])
        assert not obs["image/front"].any()
        step = env.step(np.zeros((2, 4), np.float32))
        assert step.obs["state"].shape == (2, 11) and not step.obs["image/front"].any()
    finally:
        env.close()
