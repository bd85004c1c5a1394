"""EpisodeStore <-> LeRobotDataset v3 through lerobot's own class (acce/store/lerobot_io.py)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from acce.data_config import DatasetConfig
from acce.store import EpisodeStore, export_lerobot, import_lerobot

# Shared helpers; pytest puts this directory on sys.path (rootdir import mode, no __init__.py in tests/).
from test_episode_store import SCHEMA, assert_episode_equal, make_episode

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may touch the hub
pytest.importorskip("lerobot")


def test_export_import_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    store = EpisodeStore.create(tmp_path / "s.zarr", **SCHEMA, extra={"robot": "sim-arm"})
    episodes = [make_episode(rng, 6, task="pick", success_at=4), make_episode(rng, 0, task="place"),
                make_episode(rng, 9, task="pick")]
    episodes[1].source, episodes[2].source = "real", "imagined"
    store.append_many(episodes)

    out = export_lerobot(store, tmp_path / "lerobot")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("acce/episodes", root=out)
    assert (ds.num_episodes, ds.num_frames, ds.fps) == (3, 7 + 1 + 10, 10)
    item = ds[6]  # the final frame of episode 0: padded transition, flagged
    assert bool(item["acce.is_final_frame"]) and float(item["action"].abs().sum()) == 0.0
    assert item["task"] == episodes[0].instruction
    assert json.loads((out / "meta" / "acce.json").read_text())["schema"]["extra"] == {"robot": "sim-arm"}

    back = import_lerobot(out, tmp_path / "back.zarr")
    assert back.meta == store.meta and len(back) == 3
    for ep, got in zip(episodes, back.iter_episodes()):
        assert_episode_equal(ep, got)
    with pytest.raises(FileExistsError):
        export_lerobot(store, out)


def test_aux_labels_survive_export_and_import(tmp_path):
    rng = np.random.default_rng(2)
    store = EpisodeStore.create(tmp_path / "aux.zarr", **SCHEMA, aux_dim=4)
    episodes = [make_episode(rng, t) for t in (3, 5)]
    for ep in episodes:
        ep.obs["aux"] = rng.standard_normal((ep.num_steps + 1, 4)).astype(np.float32)
    store.append_many(episodes)
    back = import_lerobot(export_lerobot(store, tmp_path / "lerobot"), tmp_path / "back.zarr")
    assert back.schema.aux_dim == 4 and back.meta == store.meta
    for ep, got in zip(episodes, back.iter_episodes()):
        assert_episode_equal(ep, got)


@pytest.mark.filterwarnings("ignore:Converting input from bool")
def test_import_foreign_lerobot_dataset_as_demos(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    rng = np.random.default_rng(2)
    features = {"observation.images.top": {"dtype": "image", "shape": (12, 10, 3), "names": ["height", "width", "c"]},
                "observation.state": {"dtype": "float32", "shape": (2,), "names": None},
                "action": {"dtype": "float32", "shape": (2,), "names": None},
                "next.done": {"dtype": "bool", "shape": (1,), "names": None}}
    ds = LeRobotDataset.create("someone/demos", fps=30, root=tmp_path / "demos", features=features, use_videos=False)
    images = rng.integers(0, 256, (4, 12, 10, 3), dtype=np.uint8)
    for i in range(4):
        ds.add_frame({"observation.images.top": images[i], "observation.state": np.full(2, i, np.float32),
                      "action": np.full(2, i / 4, np.float32), "next.done": np.array([i == 3]), "task": "stack"})
    ds.save_episode()
    ds.finalize()

    as_is = DatasetConfig(action_norm="none")  # actions already in [-1, 1]: imported unchanged
    store = import_lerobot(tmp_path / "demos", tmp_path / "s.zarr", repo_id="someone/demos", config=as_is)
    assert store.meta["control_hz"] == 30.0 and store.meta["image_shapes"] == {"top": [12, 10]}
    ep = store[0]
    assert ep.num_steps == 3 and np.array_equal(ep.obs["image/top"], images)
    assert np.array_equal(ep.action[:, 0], np.array([0, 0.25, 0.5], np.float32))
    assert (ep.source, ep.instruction, ep.episode_id, ep.behavior_version.tolist()) == (
        "demo", "stack", "someone/demos:0", [-1, -1, -1])
    assert ep.truncated.tolist() == [False, False, True] and not ep.terminated.any()

    # Imported as they are, actions outside [-1, 1] are rejected and leave the target store unchanged.
    ds = LeRobotDataset.create("someone/raw", fps=30, root=tmp_path / "raw", features=features, use_videos=False)
    for scale in (1.0, 5.0):
        for i in range(2):
            ds.add_frame({"observation.images.top": images[i], "observation.state": np.zeros(2, np.float32),
                          "action": np.full(2, scale * 0.5, np.float32), "next.done": np.array([False]), "task": "x"})
        ds.save_episode()
    ds.finalize()
    with pytest.raises(ValueError, match="outside \\[-1, 1\\].*dataset.action_norm=minmax"):
        import_lerobot(tmp_path / "raw", tmp_path / "s.zarr", config=as_is)
    assert len(EpisodeStore.open(tmp_path / "s.zarr")) == 1


def test_import_rejects_a_non_dataset_without_downloading(tmp_path):
    with pytest.raises(FileNotFoundError, match="meta/info.json"):
        import_lerobot(tmp_path, tmp_path / "s.zarr")
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "info.json").write_text("{}")  # LeRobotDataset would try the hub for the rest
    with pytest.raises(FileNotFoundError, match="meta/tasks.parquet.*never downloads"):
        import_lerobot(tmp_path, tmp_path / "s.zarr")
