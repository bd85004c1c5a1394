"""Every registered task, parametrized: spec, determinism, experts, instruction splits, gymnasium checker."""
import re
import string

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import sim
from acce.config import KNOWN_TASKS
from sim.env import ACTION_DIM, STATE_DIM, TabletopEnv
from sim.task import TEST_SEEDS, TRAIN_SEEDS
from sim.tasks import GYM_IDS, TASKS

TASK_NAMES = sorted(TASKS)


@pytest.fixture
def make_env():
    envs = []

    def make(*args, **kwargs):
        envs.append(TabletopEnv(*args, **kwargs))
        return envs[-1]
    yield make
    for e in envs:
        e.close()


def test_registry_lists_agree():
    assert set(TASKS) == set(sim.TASK_NAMES) == set(KNOWN_TASKS)
    assert len(TASKS) >= 4 and "track" in TASKS


def test_seed_ranges_are_disjoint():
    from acce.wiring import SEED_SPLIT_STARTS
    from sim.task import EVAL_SEEDS, SEED_SPLITS, VALIDATION_SEEDS
    assert TRAIN_SEEDS.stop <= VALIDATION_SEEDS.start and VALIDATION_SEEDS.stop <= TEST_SEEDS.start
    assert VALIDATION_SEEDS.start == EVAL_SEEDS.start and TEST_SEEDS.stop == EVAL_SEEDS.stop
    assert SEED_SPLIT_STARTS == {"val": SEED_SPLITS["val"].start, "test": SEED_SPLITS["test"].start}


@pytest.mark.parametrize("task", TASK_NAMES)
def test_reset_and_step_match_the_spec(task, make_env):
    env = make_env(task, image_size=48)
    obs, info = env.reset(seed=1)
    assert set(obs) == {"image/front", "state", "instruction"}
    assert obs["image/front"].shape == (48, 48, 3) and obs["image/front"].dtype == np.uint8
    assert obs["state"].shape == (STATE_DIM,) and obs["state"].dtype == np.float32
    assert isinstance(obs["instruction"], str) and obs["instruction"]
    assert obs["image/front"].std() > 5, "the camera sees a textured scene, not a blank frame"
    rng = np.random.default_rng(0)
    for _ in range(10):
        obs, reward, terminated, truncated, info = env.step(rng.uniform(-1, 1, ACTION_DIM).astype(np.float32))
        assert np.isfinite(obs["state"]).all() and np.isfinite(reward)
        assert isinstance(terminated, bool) and isinstance(truncated, bool)
        assert set(info["reward_terms"]) == set(env.task.reward_weights)
        assert reward == pytest.approx(sum(env.task.reward_weights[k] * v for k, v in info["reward_terms"].items()))
        if terminated or truncated:
            break


@pytest.mark.parametrize("task", TASK_NAMES)
def test_seeding_is_deterministic(task, make_env):
    a, b = make_env(task), make_env(task)
    oa, _ = a.reset(seed=123)
    ob, _ = b.reset(seed=123)
    assert oa["instruction"] == ob["instruction"]
    np.testing.assert_array_equal(oa["image/front"], ob["image/front"])
    actions = np.random.default_rng(5).uniform(-1, 1, (5, ACTION_DIM)).astype(np.float32)
    for act in actions:
        sa, sb = a.step(act), b.step(act)
        np.testing.assert_array_equal(sa[0]["state"], sb[0]["state"])
        np.testing.assert_array_equal(sa[0]["image/front"], sb[0]["image/front"])
    oc, _ = a.reset(seed=124)
    assert not np.array_equal(oc["image/front"], oa["image/front"])


@pytest.mark.parametrize("task", TASK_NAMES)
def test_expert_succeeds_on_100_test_seeds(task, make_env):
    env = make_env(task)
    successes = 0
    for seed in TEST_SEEDS[:100]:
        env.reset(seed=seed)
        for _ in range(env.max_episode_steps):
            _, terminated, truncated, info = env.step_no_render(env.expert_action())
            if terminated or truncated:
                break
        successes += info["success"]
    assert successes >= 95, f"{task} expert: {successes}/100"


@pytest.mark.parametrize("task", TASK_NAMES)
def test_noisy_expert_differs_but_mostly_succeeds(task, make_env):
    env = make_env(task)
    env.reset(seed=7)
    clean = env.expert_action()
    noisy = env.expert_action(noise_std=0.3)
    assert not np.allclose(clean, noisy) and np.abs(noisy).max() <= 1.0


@pytest.mark.parametrize("task", TASK_NAMES)
def test_train_validation_and_test_paraphrases_are_disjoint(task, make_env):
    """Three paraphrase sets: training, validation (choices are made on it) and test (reported only), so that no
    choice made on validation has seen the reported paraphrases."""
    cls = TASKS[task]
    sets = {"train": cls.train_templates, "val": cls.val_templates, "heldout": cls.heldout_templates}
    assert all(len(t) >= 2 for t in sets.values())
    seen = {}
    for split, templates in sets.items():
        env = make_env(task, instruction_split=split)
        seen[split] = {env.reset(seed=s)[0]["instruction"] for s in range(60)}
        patterns = [re.compile(re.sub(r"\\\{\w+\\\}", r"\\w+", re.escape(t)) + "$") for t in templates]
        assert all(any(p.match(i) for p in patterns) for i in seen[split]), (split, seen[split])
    for a, b in (("train", "val"), ("train", "heldout"), ("val", "heldout")):
        assert not set(sets[a]) & set(sets[b]) and seen[a].isdisjoint(seen[b]), (a, b)
    every = set().union(*seen.values())
    assert all(set(i) <= set(string.ascii_letters + string.digits + " ,.'-") for i in every)


@pytest.mark.parametrize("task", TASK_NAMES)
def test_no_training_or_validation_paraphrase_opens_with_a_test_verb(task):
    """The test wording stays unseen: no training or validation template starts with a test template's verb."""
    cls = TASKS[task]
    test_verbs = {t.split()[0] for t in cls.heldout_templates}
    assert not test_verbs & {t.split()[0] for t in cls.train_templates + cls.val_templates}


def test_push_and_pick_place_share_goal_only_training_wording():
    """Words that name the goal but not the manner are in both tasks' training paraphrases, so cloning must settle
    push against pick_place from the scene where the words do not (unseen verbs halved push without it)."""
    from sim.task import CUBE_TO_PAD_TEMPLATES
    shared = set(TASKS["push"].train_templates) & set(TASKS["pick_place"].train_templates)
    assert len(CUBE_TO_PAD_TEMPLATES) >= 3 and shared == set(CUBE_TO_PAD_TEMPLATES)
    assert set(TASKS["push"].train_templates) - shared and set(TASKS["pick_place"].train_templates) - shared


@pytest.mark.parametrize("task", TASK_NAMES)
def test_gymnasium_checker_and_registration(task):
    env = gym.make(GYM_IDS[task], image_size=32)
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_step_equals_step_no_render_then_observe(make_env):
    a, b = make_env("track"), make_env("track")
    a.reset(seed=3)
    b.reset(seed=3)
    act = np.array([0.3, -0.2, 0.1, 1.0], np.float32)
    obs_a, r_a, *_ = a.step(act)
    r_b, *_ = b.step_no_render(act)
    obs_b = b.observe()
    assert r_a == r_b
    np.testing.assert_array_equal(obs_a["image/front"], obs_b["image/front"])


def test_nan_action_is_rejected(make_env):
    env = make_env("reach")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.array([np.nan, 0, 0, 0], np.float32))


def test_unknown_task_names_the_registered_ones():
    with pytest.raises(ValueError, match="registered tasks"):
        TabletopEnv("reahc")


def test_track_ball_moves_and_faster_ball_config(make_env):
    from sim.tasks.track import TrackConfig
    env = make_env("track", task_config=TrackConfig(ball_speed_mps=0.3))
    env.reset(seed=0)
    start = env.scene.ball_pos(env.task.target)
    env.step_no_render(np.zeros(4, np.float32))
    moved = np.linalg.norm(env.scene.ball_pos(env.task.target) - start)
    assert moved == pytest.approx(0.03, rel=0.05)  # 0.3 m/s for one 0.1 s control step (chord ~ arc)


def test_track_seq_each_touch_shows_the_next_ball_of_the_instruction(make_env):
    """Drive the fingertip onto the current ball three times (where the ball will be after this step's motion).
    Each touch pays the touch term once, hides the touched ball and shows the next ball of the instruction's order
    at least its orbit radius (>= 8 cm) from the fingertip; a step without contact pays none; success and
    termination come with the third touch only."""
    from sim.scene import BALL_RADIUS_M
    env = make_env("track_seq", image_size=32)
    obs, _ = env.reset(seed=4)
    task, scene = env.task, env.scene
    order, instruction = task.order, obs["instruction"]
    assert sorted(order) == ["blue", "green", "red"]
    assert instruction.find(order[0]) < instruction.find(order[1]) < instruction.find(order[2])

    def visible(color: str) -> bool:
        return bool(scene.model.geom_rgba[scene.model.body_geomadr[scene.model.body(f"ball_{color}").id], 3] > 0)

    still = np.array([0.0, 0.0, 0.0, 1.0], np.float32)
    for k, color in enumerate(order):
        assert task.target == color and [visible(c) for c in order] == [c == color for c in order]
        scene.place_gripper(np.array([*task._ball_xy(color, 0.1), BALL_RADIUS_M]), opening01=0.0)
        scene.forward()
        _, terminated, truncated, info = env.step_no_render(still)
        assert info["reward_terms"]["touch"] == 1.0 and not truncated
        assert terminated == info["success"] == (k == 2)
        if k < 2:
            nxt = order[k + 1]
            assert visible(nxt) and not visible(color) and task.target == nxt
            gap = np.linalg.norm(scene.ball_pos(nxt)[:2] - scene.tip_pos[:2])
            assert gap >= max(task.radius[nxt], 0.08) - 1e-6
            _, terminated, _, info = env.step_no_render(still)
            assert info["reward_terms"]["touch"] == 0.0 and not terminated and not info["success"]


def test_push_reward_pays_for_the_point_behind_the_cube_not_the_cube(make_env):
    """Hand numbers: cube at (0, 0), pad at (0.2, 0) -> push point (-0.03, 0, 0.012); a tip on top of the cube is
    farther from it than a tip behind the cube (distance-to-cube shaping ranked them the other way round)."""
    from sim.scene import CUBE_HALF_M
    env = make_env("push")
    env.reset(seed=0)
    task, scene = env.task, env.scene
    scene.set_cube(task.cube, np.array([0.0, 0.0]))
    scene.set_pad(task.pad, np.array([0.2, 0.0]))
    scene.forward()
    np.testing.assert_allclose(task.push_point(scene), [-0.03, 0.0, 0.012], atol=1e-6)
    behind, on_top = np.array([-0.05, 0.0, 0.012]), np.array([0.0, 0.0, 2 * CUBE_HALF_M + 0.01])
    dists = {}
    for name, tip in (("behind", behind), ("on_top", on_top)):
        scene.place_gripper(tip)
        scene.forward()
        dists[name] = task.reward_terms(scene)["tip_to_push_point_m"]
    assert dists["behind"] == pytest.approx(0.02, abs=2e-3)
    assert dists["on_top"] == pytest.approx(np.hypot(0.03, 0.05 - 0.012 + 0.0), abs=2e-3)
    assert dists["behind"] < dists["on_top"]


@pytest.mark.parametrize("funnel_m,approach,at_least", [(0.0, "over", 62), (0.04, "over", 82), (0.0, "around", 85)])
def test_push_expert_tolerates_a_cloned_policys_noise(make_env, funnel_m, approach, at_least):
    """The push expert steers onto the cube-pad line instead of lifting off at 1.2 cm of lateral error: 74/100 at
    action noise 0.6 on these seeds and this noise stream, 58/100 before; a regression to the brittle expert fails.
    With the descent funnel (PushConfig.descent_funnel_m = 0.04): 90/100. Going round the cube low
    (approach="around"): 94/100 at noise 0.6 in `acce bench experts`-style runs."""
    from sim.tasks.push import PushConfig
    env = make_env("push", task_config=PushConfig(descent_funnel_m=funnel_m, approach=approach))
    rng = np.random.default_rng(0)
    successes = 0
    for seed in TEST_SEEDS[:100]:
        env.reset(seed=seed)
        for _ in range(env.max_episode_steps):
            action = env.expert_action()
            action[:3] = np.clip(action[:3] + 0.6 * rng.standard_normal(3), -1, 1)
            _, terminated, truncated, info = env.step_no_render(action)
            if terminated or truncated:
                break
        successes += info["success"]
    assert successes >= at_least, f"push expert at noise 0.6 (funnel {funnel_m} m, {approach}): {successes}/100"


def test_push_descent_funnel_must_not_be_negative():
    from sim.tasks.push import PushConfig
    with pytest.raises(ValueError, match="descent_funnel_m"):
        PushConfig(descent_funnel_m=-0.01)


def test_push_around_expert_goes_round_the_cube_low(make_env):
    """Hand geometry: cube at (0, 0), pad at (0.2, 0) (push along +x), pre-push point (-0.06, 0). A tip in front
    of the cube at (0.06, 0.01), pushing height: the straight path to (-0.06, 0) runs through the cube, so the expert
    heads for the waypoint furthest round that it can reach in a clear line, 8 cm out on its own (+y) side: 135
    degrees (-0.057, 0.057) is blocked from there (the path passes 3.2 cm from the cube), 90 degrees (0, 0.08) is
    clear. It stays at pushing height. A tip at (-0.1, 0.1), 8 cm up, has a clear line and descends toward
    (-0.06, 0) directly."""
    from sim.tasks.push import PUSH_Z_M, PushConfig
    env = make_env("push", task_config=PushConfig(approach="around"))
    env.reset(seed=0)
    task, scene = env.task, env.scene
    scene.set_cube(task.cube, np.array([0.0, 0.0]))
    scene.set_pad(task.pad, np.array([0.2, 0.0]))
    scene.place_gripper(np.array([0.06, 0.01, PUSH_Z_M]))
    scene.forward()
    tip = scene.tip_pos.copy()
    action = task.expert_action(scene)
    step = task.config.max_step_m
    direction = action[:2] / np.linalg.norm(action[:2])  # a saturated action keeps the goal's direction
    want = (np.array([0.0, 0.08]) - tip[:2]) / np.linalg.norm(np.array([0.0, 0.08]) - tip[:2])
    np.testing.assert_allclose(direction, want, atol=0.02)
    assert abs(action[2] * step - (PUSH_Z_M - tip[2])) < 0.005  # no lift
    scene.place_gripper(np.array([-0.1, 0.1, 0.08]))
    scene.forward()
    tip = scene.tip_pos.copy()
    action = task.expert_action(scene)
    direction = action[:2] / np.linalg.norm(action[:2])
    want = (np.array([-0.06, 0.0]) - tip[:2]) / np.linalg.norm(np.array([-0.06, 0.0]) - tip[:2])
    np.testing.assert_allclose(direction, want, atol=0.02)
    assert action[2] < 0  # coming down


def test_push_approach_must_be_known():
    from sim.tasks.push import PushConfig
    with pytest.raises(ValueError, match="approach must be 'over' or 'around'"):
        PushConfig(approach="under")


@pytest.mark.parametrize("task", TASK_NAMES)
def test_aux_labels_are_the_named_object_and_goal_and_only_on_request(task, make_env):
    from sim.task import AUX_DIM
    plain = make_env(task, image_size=16)
    assert "aux" not in plain.reset(seed=3)[0] and "aux" not in plain.observation_space.spaces
    env = make_env(task, image_size=16, aux_labels=True)
    obs, _ = env.reset(seed=3)
    assert obs["aux"].shape == (AUX_DIM,) and obs["aux"].dtype == np.float32
    assert env.observation_space["aux"].contains(obs["aux"])
    t, scene = env.task, env.scene
    if task == "reach":
        obj = goal = scene.cube_pos(t.target)
    elif task in ("track", "track_seq"):  # track_seq: the ball to touch now
        obj = goal = scene.ball_pos(t.target)
    else:  # push, pick_place: the named cube, then the named pad
        obj, goal = scene.cube_pos(t.cube), scene.pad_pos(t.pad)
    np.testing.assert_allclose(obs["aux"], np.concatenate([obj[:2], goal[:2]]), atol=1e-6)
    for _ in range(5):  # labels follow the scene as things move (the expert pushes, the balls orbit)
        obs, *_ = env.step(env.expert_action())
    np.testing.assert_allclose(obs["aux"], env.task.aux_targets(env.scene), atol=1e-6)


ONE_OFF_TERMS = {"track_seq": {"touch"}}
"""reward terms paid once per event (touching one ball of the sequence), which cannot be farmed by lingering"""


@pytest.mark.parametrize("task", TASK_NAMES)
def test_no_step_before_success_pays(task, make_env):
    """Success ends an episode, so a step that pays (reward > 0) without succeeding is worth lingering in instead of
    succeeding, and RL learns to avoid success (pick_place paid +0.5 a step for holding the cube lifted, so
    hovering over the pad beat releasing on it). Over clean and noisy expert episodes, including the carry."""
    env = make_env(task)
    one_off = ONE_OFF_TERMS.get(task, set())
    rng = np.random.default_rng(0)
    steps = 0
    for k, seed in enumerate(TRAIN_SEEDS[:6]):
        env.reset(seed=seed)
        for _ in range(env.max_episode_steps):
            action = env.expert_action(noise_std=0.3, rng=rng) if k % 2 else env.expert_action()
            reward, terminated, truncated, info = env.step_no_render(action)
            if not info["success"]:
                lingering = reward - sum(env.task.reward_weights[t] * info["reward_terms"][t] for t in one_off)
                assert lingering <= 1e-9, f"{task}: a step before success pays {lingering:+.3f}: " \
                                          f"{info['reward_terms']}"
                steps += 1
            if terminated or truncated:
                break
    assert steps >= 20


def test_wrist_camera_rides_with_the_gripper(make_env):
    """env.cameras=[front, wrist]: the eye-in-hand view moves with the gripper, so the fingers stay put in its top
    corners while the table under them slides by; closing the gripper moves the fingers in that view."""
    env = make_env("pick_place", cameras=("front", "wrist"))
    obs, _ = env.reset(seed=1)
    assert obs["image/wrist"].shape == obs["image/front"].shape == (64, 64, 3)
    before = obs["image/wrist"].astype(int)
    for _ in range(5):
        obs, *_ = env.step(np.array([1.0, 0.5, 0.0, -1.0], np.float32))
    moved = obs["image/wrist"].astype(int)
    for _ in range(5):
        obs, *_ = env.step(np.array([0.0, 0.0, 0.0, 1.0], np.float32))
    closed = obs["image/wrist"].astype(int)
    change = np.abs(moved - before).mean(-1)
    assert change[24:40, 24:40].mean() > 10  # the table and objects under the gripper moved
    assert change[:12, :6].mean() < 8 and change[:12, -6:].mean() < 8  # the fingers did not
    change = np.abs(closed - moved).mean(-1)
    assert change[:12, :6].mean() > 25 and change[:12, -6:].mean() > 25  # closing moves them
