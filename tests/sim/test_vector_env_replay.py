"""Failed-layout replay in SimVectorEnv (rollout.replay_failed): which layouts come back, when, and that nothing else
changes when it is off."""
import numpy as np
import pytest

from acce.config import load
from acce.configlib import ConfigError
from sim.task import TRAIN_SEEDS
from sim.vector_env import SimVectorEnv, task_config_from_params

SHORT = {"reach": task_config_from_params("reach", {"max_steps": 3})}
"""reach truncated after 3 control steps: zero actions never succeed in that time"""


class AlwaysReplay:
    """An rng whose replay coin always says replay; layout draws go to a real generator."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.coins = 0

    def random(self):
        self.coins += 1
        return 0.0

    def integers(self, *args, **kwargs):
        return self.rng.integers(*args, **kwargs)


def run_episodes(env: SimVectorEnv, rounds: int, expert: bool = False) -> list:
    """Step until `rounds` rounds of episodes have ended; returns each finished episode's (slot, seed, replayed)."""
    env.reset()
    ended = []
    while len(ended) < rounds * env.num_envs:
        actions = env.expert_actions() if expert else np.zeros((env.num_envs, env.action_dim), np.float32)
        step = env.step(actions, render=False)
        for i in np.flatnonzero(step.done):
            ended.append((int(i), int(step.info["seed"][i]), bool(step.info["replayed"][i]),
                          bool(step.episode_success[i])))
    return ended


def test_off_draws_the_same_layouts_as_before():
    """replay_failed=0 asks the rng nothing new: the seeds are the plain train-range draws, in reset order."""
    env = SimVectorEnv(["reach"], 2, image_size=16, seed=3, task_configs=SHORT)
    ended = run_episodes(env, rounds=3)
    ref = np.random.default_rng(3)
    expected = [TRAIN_SEEDS.start + int(ref.integers(len(TRAIN_SEEDS))) for _ in range(6)]
    assert [s for _, s, _, _ in ended] == expected
    assert not any(r for _, _, r, _ in ended) and len(env.failed) == 0
    env.close()


def test_a_failed_layout_comes_back_and_again_while_it_fails():
    env = SimVectorEnv(["reach"], 2, image_size=16, seed=0, task_configs=SHORT, replay_failed=0.5)
    env.rng = AlwaysReplay(0)
    ended = run_episodes(env, rounds=3)
    first = [(slot, seed) for slot, seed, replayed, _ in ended[:2]]
    assert not any(r for _, _, r, _ in ended[:2])  # the first round is fresh
    # every later episode replays the layout that slot's failure queued (popped oldest first: slot 0's, then 1's)
    for k in (1, 2):
        assert [(slot, seed) for slot, seed, _, _ in ended[2 * k:2 * k + 2]] == first
        assert all(r and not success for _, _, r, success in ended[2 * k:2 * k + 2])
    assert env.rng.coins >= 4
    env.close()


def test_successes_are_never_replayed():
    env = SimVectorEnv(["reach"], 2, image_size=16, seed=0, replay_failed=0.5)
    env.rng = AlwaysReplay(0)
    ended = run_episodes(env, rounds=2, expert=True)
    assert all(success for *_, success in ended)
    assert not any(r for _, _, r, _ in ended) and len(env.failed) == 0
    assert env.rng.coins == 0  # nothing queued: no coin is thrown
    env.close()


def test_capacity_keeps_the_newest_failures():
    """Both slots fail in one step while the coin says 'fresh layout': capacity 1 keeps only the later failure."""
    env = SimVectorEnv(["reach"], 2, image_size=16, seed=0, task_configs=SHORT, replay_failed=0.5, replay_capacity=1)
    env.reset()
    seeds = env.seeds.copy()
    env.rng = AlwaysReplay(0)
    env.rng.random = lambda: 0.99  # never replay
    for _ in range(3):
        step = env.step(np.zeros((2, env.action_dim), np.float32), render=False)
    assert step.done.all() and not env.replayed.any()
    assert list(env.failed) == [("reach", int(seeds[1]))]
    env.close()


@pytest.mark.parametrize("kwargs, match", [
    ({"replay_failed": 1.0}, "replay_failed must be in"),
    ({"replay_failed": -0.1}, "replay_failed must be in"),
    ({"replay_failed": 0.5, "replay_capacity": 0}, "replay_capacity must be positive"),
    ({"replay_failed": 0.5, "episode_seeds": iter([1, 2])}, "must not replay"),
])
def test_bad_replay_settings_are_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SimVectorEnv(["reach"], 2, image_size=16, **kwargs)


@pytest.mark.parametrize("override, match", [
    ("rollout.replay_failed=1", "rollout.replay_failed must be in"),
    ("rollout.replay_capacity=0", "rollout.replay_capacity must be positive"),
])
def test_config_checks(override, match):
    with pytest.raises(ConfigError, match=match):
        load("configs/debug.yaml", [override])


def test_training_envs_get_the_setting_evaluation_envs_do_not():
    from acce.wiring import eval_env_factory, rollout_env_factory
    cfg = load("configs/debug.yaml", ["rollout.replay_failed=0.25", "rollout.replay_capacity=7"])
    env = rollout_env_factory(cfg)(0)
    assert env.replay_failed == 0.25 and env.failed.maxlen == 7
    env.close()
    ev = eval_env_factory(cfg)(["reach"], 2, seeds="val", instruction_split="heldout", episode_seeds=iter(range(4)))
    assert ev.replay_failed == 0.0
    ev.close()


def test_replayed_episodes_stay_out_of_training_success_and_the_curriculum(tmp_path):
    """Replays are failures by construction: counting them would make training success read lower than the
    policy is, and failure-weighted task sampling would chase layouts that are replayed anyway."""
    from types import SimpleNamespace

    from acce.serving.inference import ServerStats
    from acce.train import Trainer
    from sim.tasks import task_id

    cfg = load("configs/debug.yaml", [f"run.out_dir={tmp_path}", "rollout.replay_failed=0.5",
                                      "rollout.task_sampling=failure"])
    trainer = Trainer(cfg, progress=False)
    reach = task_id("reach")
    recent = ([{"task_id": reach, "success": True, "return": 1.0, "length": 5, "replayed": False}] * 3
              + [{"task_id": reach, "success": False, "return": -1.0, "length": 50, "replayed": True}])
    stats = SimpleNamespace(env_steps=100, learner_version=4, server_version=4, swap_ms=0.0, queue_size=0,
                            server=ServerStats(), imagination=None)
    trainer._log_progress(stats, recent, 4, 10.0)
    assert trainer.metrics.last["episode/success/sim/reach"] == 1.0
    assert trainer.metrics.last["episode/length/sim/reach"] == 5.0
    assert trainer.metrics.last["episode/replay_share"] == 0.25
    for ep in recent:
        trainer._on_episode(ep)
    assert list(trainer.sampler.history["reach"]) == [True, True, True]
    trainer.metrics.close()
