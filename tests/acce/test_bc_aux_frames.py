"""bc.aux_frames: frames that train only the aux head (no action target), from fresh layouts near the arm's start
pose, so that the aux head must read the goal from the image rather than from where the demo's arm is heading."""
import numpy as np
import pytest
import torch

from acce.bc import DemoDataset
from acce.config import load
from test_bc import episode, with_aux  # noqa: E402 (tests/acce is on sys.path)


def frames(n, aux_value):
    return {"image/front": np.full((n, 8, 8, 3), 7, np.uint8), "state": np.full((n, 2), 9.0, np.float32),
            "aux": np.full((n, 2), aux_value, np.float32), "instruction": ["look"] * n}


def test_aux_frames_add_rows_with_no_action_target_and_the_demos_aux_scale():
    data = DemoDataset([with_aux(episode(2), [[0.0, 1.0], [2.0, 1.0], [4.0, 1.0]])], chunk_len=2, max_delay=1,
                       action_dim=2)
    data.add_aux_frames(frames(3, 3.0), np.array([5, 5, 5]))
    assert len(data) == 5 and data.instructions[2:] == ["look"] * 3 and data.task_ids[2:] == [5, 5, 5]
    inputs, target, mask = data.batch(np.arange(5))
    assert mask[:2].any() and not mask[2:].any()  # frames never enter the action loss
    assert not target[2:].any() and not inputs["prefix"][2:].any()
    np.testing.assert_allclose(data.aux_mean, [1.0, 1.0])  # standardized by the demos: (3 - 1) / 1 = 2
    np.testing.assert_allclose(inputs["aux"][2:, 0], [2.0, 2.0, 2.0])
    assert inputs["state"][2:].tolist() == [[9.0, 9.0]] * 3


def test_aux_frames_need_the_demos_keys_and_labels():
    with pytest.raises(ValueError, match="demos must carry aux labels"):
        DemoDataset([episode(2)], chunk_len=2, max_delay=0, action_dim=2).add_aux_frames(frames(1, 0.0), np.array([0]))
    data = DemoDataset([with_aux(episode(2), [[0.0, 1.0]] * 3)], chunk_len=2, max_delay=0, action_dim=2)
    bad = frames(1, 0.0)
    del bad["state"]
    with pytest.raises(ValueError, match="state"):
        data.add_aux_frames(bad, np.array([0]))
    with pytest.raises(Exception, match="bc.aux_loss_coef > 0"):
        load(None, ["bc.aux_frames=100", "bc.aux_loss_coef=0"])
    with pytest.raises(Exception, match="count >= 0"):
        load(None, ["bc.aux_frames=-1", "bc.aux_loss_coef=1"])


def test_a_batch_of_aux_frames_alone_trains_only_the_aux_head():
    """action loss 0 on frames-only batches (masks all False), and the aux loss still falls"""
    from acce.policy.build import build_policy
    from acce.runtime.learner import make_learner
    cfg = load("configs/debug.yaml", ["bc.aux_loss_coef=1.0"])
    torch.manual_seed(0)
    policy = build_policy(cfg, np.zeros((8, 7), np.float32), aux_dim=4)
    learner = make_learner(policy, cfg.learner, seed=0)
    learner.reset_optimizer(1e-3)
    rng = np.random.default_rng(0)
    size = cfg.env.image_size
    inputs = {"image/front": rng.integers(0, 255, (4, size, size, 3)).astype(np.uint8),
              "state": np.zeros((4, 7), np.float32), "aux": rng.normal(size=(4, 4)).astype(np.float32),
              "instruction": ["reach the red cube"] * 4, "prefix": np.zeros((4, cfg.policy.max_delay_steps, 4),
                                                                             np.float32),
              "delay_steps": np.zeros(4, np.int64)}
    target = np.ones((4, cfg.policy.chunk_len, 4), np.float32)
    mask = np.zeros((4, cfg.policy.chunk_len), bool)
    losses = [learner.bc_step(inputs, target, mask, 0, 1.0) for _ in range(30)]
    assert all(a == 0.0 for a, _ in losses)
    assert losses[-1][1] < 0.5 * losses[0][1]


def test_aux_frames_come_from_fresh_layouts_near_the_start_pose():
    from acce.warmstart import AUX_FRAME_WALK_STEPS, aux_frames
    from acce.wiring import make_sim_env
    cfg = load("configs/debug.yaml", ["env.num_envs=2", "bc.aux_loss_coef=1.0"])

    def make_env(tasks, num_envs, **kw):
        return make_sim_env(tasks, num_envs, image_size=cfg.env.image_size, aux_labels=True, **kw)
    obs, task_ids = aux_frames(make_env, cfg, 2 * AUX_FRAME_WALK_STEPS * 2 + 3)
    n = 2 * AUX_FRAME_WALK_STEPS * 2 + 3
    assert len(obs["instruction"]) == n and task_ids.shape == (n,) and obs["aux"].shape[0] == n
    assert obs["image/front"].shape == (n, cfg.env.image_size, cfg.env.image_size, 3)
    # three resets of two envs: six layouts among the frames, each held for AUX_FRAME_WALK_STEPS frames
    layouts = {tuple(np.round(a, 4)) for a in obs["aux"]}
    assert len(layouts) >= 5
    # within a layout the fingertip stays near where the reset put it: a few random steps, not a reach
    from sim.env import TabletopEnv
    step_m = TabletopEnv("reach").max_step_m
    for layout in layouts:
        tip = obs["state"][[tuple(np.round(a, 4)) == layout for a in obs["aux"]], :3]
        assert np.abs(tip - tip[0]).max() <= AUX_FRAME_WALK_STEPS * step_m + 1e-3


def test_aux_episodes_add_every_step_without_its_actions():
    """bc.dagger_targets='aux': a DAgger episode's steps train the aux head only; the demos' targets are unchanged"""
    demo = with_aux(episode(2), [[0.0, 1.0], [2.0, 1.0], [4.0, 1.0]])
    data = DemoDataset([demo], chunk_len=2, max_delay=1, action_dim=2)
    before = data.targets.copy()
    visited = with_aux(episode(3), [[6.0, 1.0]] * 4)
    data.add_aux_episodes([visited])
    assert len(data) == 2 + 3 and data.task_ids[2:] == [visited.task_id] * 3
    inputs, target, mask = data.batch(np.arange(5))
    assert mask[:2].any() and not mask[2:].any() and not target[2:].any()
    np.testing.assert_array_equal(data.targets[:2], before)
    np.testing.assert_allclose(inputs["aux"][2:, 0], [5.0, 5.0, 5.0])  # (6 - 1) / 1: the demo's decision frames 0, 2
    with pytest.raises(Exception, match="bc.aux_loss_coef > 0 too"):
        load(None, ["bc.dagger_rounds=1", "bc.dagger_targets=aux"])
    with pytest.raises(Exception, match="'expert' or 'aux'"):
        load(None, ["bc.dagger_targets=actions"])


@pytest.mark.parametrize("targets", ["expert", "aux"])
def test_a_dagger_round_feeds_the_actions_or_only_the_aux_head(tmp_path, monkeypatch, targets):
    """the real DAgger rollouts of a tiny warm start: with 'aux' its decisions join without action targets"""
    from acce.warmstart import bc_warmstart

    class Metrics:
        def scalars(self, values, step):
            pass

    cfg = load("configs/debug.yaml", ["bc.episodes=2", "bc.steps=2", "bc.dagger_rounds=1", "bc.dagger_episodes=2",
                                      "bc.aux_loss_coef=1.0", f"bc.dagger_targets={targets}", "env.num_envs=2"])
    import acce.bc
    seen = {}
    real_train = acce.bc.bc_train

    def spying_train(learner, data, *args, **kw):
        seen[kw["desc"]] = (len(data), int(data.masks.any(1).sum()))
        return real_train(learner, data, *args, **kw)
    monkeypatch.setattr(acce.bc, "bc_train", spying_train)
    _, info = bc_warmstart(cfg, tmp_path, metrics=Metrics(), progress=False)
    (n0, cloned0), (n1, cloned1) = seen["cloning phase 1/2"], seen["cloning phase 2/2"]
    assert n1 > n0 and "dagger_round1_success" in info
    assert cloned1 == (cloned0 if targets == "aux" else n1)


def mixed_data():
    """two demo decisions (with action targets) and three aux-only frames"""
    data = DemoDataset([with_aux(episode(2), [[0.0, 1.0], [2.0, 1.0], [4.0, 1.0]])], chunk_len=2, max_delay=1,
                       action_dim=2)
    data.add_aux_frames(frames(3, 3.0), np.array([5, 5, 5]))
    return data


@pytest.mark.parametrize("share,aux_rows", [(0.3, 3), (0.25, 2), (0.0, 0), (0.9, 9), (0.99, 9)])
def test_aux_only_share_fixes_the_aux_only_rows_per_batch(share, aux_rows):
    data = mixed_data()
    for seed in range(5):
        idx = data.sample(np.random.default_rng(seed), 10, share)
        # rows 2-4 are the aux-only frames; 0.99 is capped so that every batch clones some action
        assert len(idx) == 10 and (idx >= 2).sum() == aux_rows


def test_aux_only_share_none_draws_by_count_as_before():
    data = mixed_data()
    np.testing.assert_array_equal(data.sample(np.random.default_rng(3), 64, None),
                                  np.random.default_rng(3).integers(5, size=64))
    demos_only = DemoDataset([episode(4)], chunk_len=2, max_delay=0, action_dim=2)  # one kind: the share is moot
    np.testing.assert_array_equal(demos_only.sample(np.random.default_rng(1), 16, 0.5),
                                  np.random.default_rng(1).integers(4, size=16))


def test_bc_train_batches_hold_the_configured_aux_only_share():
    from acce.bc import bc_train

    class CountingLearner:
        def __init__(self):
            self.optimizer = type("Opt", (), {"param_groups": [{"lr": 1e-3}]})()
            self.no_target_rows = []

        def bc_step(self, inputs, target, mask, augment_px, aux_coef):
            self.no_target_rows.append(int((~mask.any(1)).sum()))
            return 0.0, 0.0

    for share, expected in ((0.5, 2), (None, None)):
        learner = CountingLearner()
        bc_train(learner, mixed_data(), steps=40, batch_size=4, progress=False, aux_only_share=share)
        if expected is None:  # by count: 3 of 5 rows, so batches vary
            assert len(set(learner.no_target_rows)) > 1 and 1.6 < np.mean(learner.no_target_rows) < 3.2
        else:
            assert learner.no_target_rows == [expected] * 40


def test_aux_only_share_config_checks():
    assert load(None, ["bc.aux_loss_coef=1", "bc.aux_only_share=0.3"]).bc.aux_only_share == 0.3
    with pytest.raises(Exception, match=r"in \[0, 1\)"):
        load(None, ["bc.aux_loss_coef=1", "bc.aux_only_share=1.0"])
    with pytest.raises(Exception, match="aux_loss_coef > 0"):
        load(None, ["bc.aux_only_share=0.3"])
