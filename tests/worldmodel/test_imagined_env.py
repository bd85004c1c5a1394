import threading

import numpy as np
import pytest
import torch
from wm_helpers import fake_episode, tiny_model

from worldmodel.imagined_env import ImaginedEnv


@pytest.fixture
def episodes():
    return [fake_episode(6, seed=k, task_id=k) for k in range(3)]


def _calm(model, terminated_logit: float = -10.0):
    """Every dynamics head identical (zero disagreement) and a constant terminated/success logit."""
    with torch.no_grad():
        for layer in model.dynamics.layers:
            layer.weight[:] = layer.weight[0].clone()
            layer.bias[:] = layer.bias[0].clone()
        last = model.done_head[-1]
        last.weight.zero_()
        last.bias.fill_(terminated_logit)
    return model


def test_branches_start_from_real_frames_with_their_instruction(episodes):
    env = ImaginedEnv(tiny_model(), 4, start_episodes=episodes + [fake_episode(3, 9, source="imagined")])
    assert len(env.starts) == 3  # imagined episodes never become start states
    obs = env.reset()
    by_instruction = {ep.instruction: ep for ep in episodes}
    for i in range(4):
        ep = by_instruction[obs["instruction"][i]]
        assert obs["task_id"][i] == ep.task_id
        frames = ep.obs["image/front"][:-1]  # any frame with a transition after it
        t = [k for k in range(len(frames)) if np.array_equal(frames[k], obs["image/front"][i])]
        assert t and np.array_equal(ep.obs["state"][t[0]], obs["state"][i])


def test_no_start_states_is_a_clear_error():
    with pytest.raises(RuntimeError, match="add_episodes"):
        ImaginedEnv(tiny_model(), 2).reset()


def test_gate_truncates_when_heads_disagree(episodes):
    model = _calm(tiny_model())
    with torch.no_grad():  # push the heads' outputs apart: each head adds a different large offset
        last = model.dynamics.layers[-1]
        for k in range(last.bias.shape[0]):
            last.bias[k] = 10.0 * torch.randn(last.bias.shape[-1], generator=torch.Generator().manual_seed(k))
    env = ImaginedEnv(model, 3, start_episodes=episodes, max_disagreement=0.5, horizon=10)
    env.reset()
    step = env.step(np.zeros((3, 4), np.float32))
    assert (step.info["disagreement"] > 0.5).all()
    assert step.truncated.all() and not step.terminated.any()
    assert (step.info["episode_length"] == 1).all() and set(step.final_obs) == {0, 1, 2}
    assert env.stats["gate_truncations"] == 3


def test_agreeing_heads_run_to_the_horizon(episodes):
    env = ImaginedEnv(_calm(tiny_model()), 2, start_episodes=episodes, max_disagreement=0.5, horizon=5)
    env.reset()
    for t in range(5):
        step = env.step(np.zeros((2, 4), np.float32), render=False)
        assert (step.info["disagreement"] < 1e-5).all()
        assert step.truncated.all() == (t == 4) and not step.terminated.any()
    assert env.stats["horizon_truncations"] == 2 and env.stats["gate_truncations"] == 0


def test_terminated_head_ends_branches(episodes):
    env = ImaginedEnv(_calm(tiny_model(), terminated_logit=5.0), 2, start_episodes=episodes)
    env.reset()
    step = env.step(np.zeros((2, 4), np.float32))
    assert step.terminated.all() and step.success.all() and not step.truncated.any()
    assert step.episode_success.all()


def test_heads_act_on_the_models_thresholds(episodes):
    """A logit of -3 ends nothing at the default threshold 0, and ends every branch once the (calibrated)
    thresholds sit below it (imagination.wm_calibrate_frames)."""
    for threshold, ends in ((0.0, False), (-4.0, True)):
        model = _calm(tiny_model(), terminated_logit=-3.0)
        model.done_threshold.fill_(threshold)
        env = ImaginedEnv(model, 2, start_episodes=episodes)
        env.reset()
        step = env.step(np.zeros((2, 4), np.float32))
        assert step.terminated.all() == ends and step.success.all() == ends and not step.terminated.any() != ends


def test_observations_are_decoded_lazily_and_in_index_order(episodes):
    env = ImaginedEnv(_calm(tiny_model()), 3, start_episodes=episodes, horizon=50)
    first = env.reset()
    env.step(np.zeros((3, 4), np.float32), render=False)
    assert env._dirty.all()
    sub = env.observe([2, 0])
    assert not env._dirty[[0, 2]].any() and env._dirty[1]
    full = env.observe()
    np.testing.assert_array_equal(sub["image/front"], full["image/front"][[2, 0]])
    assert not np.array_equal(full["image/front"], first["image/front"])  # now decoded, not the real frame


def _versioned_state(model, version: int) -> dict:
    """Weights whose reward head outputs exactly `version` (constant), spread over two tensors."""
    with torch.no_grad():
        model.reward_head[-1].weight.zero_()
        model.reward_head[-1].bias.fill_(float(version) - 0.5)
        model.reward_mean.fill_(0.5)
        model.reward_std.fill_(1.0)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_weight_swap_is_atomic_between_batches(episodes):
    model = _calm(tiny_model())
    states = {v: _versioned_state(model, v) for v in (1, 2)}
    env = ImaginedEnv(model, 4, start_episodes=episodes, horizon=50)
    env.load_weights(1, states[1])
    env.reset()
    seen, stop = [], threading.Event()

    def stepper():
        while not stop.is_set() and len(seen) < 500:
            step = env.step(np.zeros((4, 4), np.float32), render=False)
            seen.append((step.reward.copy(), step.info["wm_version"].copy()))

    thread = threading.Thread(target=stepper)
    thread.start()
    swaps = 0
    while thread.is_alive() and swaps < 120:
        env.load_weights(1 + swaps % 2, states[1 + swaps % 2])
        swaps += 1
    stop.set()
    thread.join()
    versions = {int(v[0]) for _, v in seen}
    assert versions == {1, 2}, "the swaps should interleave with the steps"
    for reward, version in seen:  # every row of every batch was computed by the version it is stamped with
        np.testing.assert_allclose(reward, version.astype(np.float32), atol=1e-5)
    assert env.wm_version == 1 + (swaps - 1) % 2 and env.stats["swaps"] == swaps + 1
