"""The warm start's demos.zarr after a failed run: nothing left that blocks the corrected retry."""
from __future__ import annotations

import pytest

import acce.collect
from acce.config import load
from acce.store.episodes import EpisodeStore
from acce.warmstart import bc_warmstart


class Stop(Exception):
    pass


def test_failed_warm_start_leaves_no_empty_demos_store(tmp_path, monkeypatch):
    cfg = load("configs/debug.yaml")

    def failing_collect(*args, **kwargs):  # e.g. a task_params error that only the recording envs see
        raise ValueError("env.task_params.reach: unknown field(s) ['bogus']")

    monkeypatch.setattr(acce.collect, "collect", failing_collect)
    with pytest.raises(ValueError, match="bogus"):
        bc_warmstart(cfg, tmp_path, metrics=None, progress=False)
    assert not (tmp_path / "demos.zarr").exists()


def test_empty_demos_store_of_another_schema_is_replaced(tmp_path, monkeypatch):
    EpisodeStore.create(tmp_path / "demos.zarr", image_shapes={"front": (48, 48)}, state_dim=7, action_dim=4,
                        control_hz=10.0)  # what a failed run with env.image_size=48 used to leave
    cfg = load("configs/debug.yaml")
    seen = {}

    def collect_then_stop(ccfg, make_env, store, **kwargs):
        seen["image_shapes"] = store.schema.image_shapes
        raise Stop

    monkeypatch.setattr(acce.collect, "collect", collect_then_stop)
    with pytest.raises(Stop):
        bc_warmstart(cfg, tmp_path, metrics=None, progress=False)
    assert seen["image_shapes"] == {"front": (32, 32)}  # the retry's schema, not refused


def test_warm_start_keeps_the_aux_standardization_it_cloned_with(tmp_path):
    """RL's aux loss (learner.aux_coef) standardizes rollout labels exactly as cloning did: the policy keeps the
    demos' mean and std and saves them."""
    import numpy as np

    from acce.bc import DemoDataset
    cfg = load("configs/debug.yaml", ["bc.episodes=2", "bc.steps=2", "bc.dagger_rounds=0", "bc.aux_loss_coef=1.0",
                                      "bc.aux_frames=0", "env.tasks=[reach]"])
    class Metrics:
        def scalars(self, values, step):
            pass

        def scalar(self, *args, **kwargs):
            pass
    learner, _ = bc_warmstart(cfg, tmp_path, metrics=Metrics(), progress=False)
    store = EpisodeStore.open(tmp_path / "demos.zarr")
    data = DemoDataset(list(store.iter_episodes()), cfg.policy.chunk_len, cfg.policy.max_delay_steps, 4)
    mean, std = learner.policy.aux_norm
    assert data.aux_dim and np.array_equal(mean, data.aux_mean) and np.array_equal(std, data.aux_std)
    saved = learner.policy.policy_state()["aux_norm"]
    assert np.allclose(saved[0], data.aux_mean) and np.allclose(saved[1], data.aux_std)
