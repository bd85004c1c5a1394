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
