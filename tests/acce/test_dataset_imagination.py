"""`acce train --data` beyond cloning: a LeRobotDataset written by lerobot's API -> import -> clone -> world model
pretrained on the same episodes with outcome labels -> RL in imagination (imagined segments only) -> a served
checkpoint; and the labels themselves, hand-checked on tiny datasets."""
import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may touch the hub
pytest.importorskip("lerobot")

from acce.configlib import ConfigError  # noqa: E402
# the SO-101 dataset writer and tiny policy; pytest puts this directory on sys.path (rootdir import mode)
from test_lerobot_any import JOINTS, TINY_POLICY, _joint_features, _write, needs_video  # noqa: E402

TINY_WM = ["wm.latent_dim=16", "wm.hidden_dim=32", "wm.channels=4", "wm.ensemble_size=3", "wm.instruction_dim=8",
           "wm.instruction_buckets=64", "wm.batch_size=4", "wm.seq_len=4", "wm.horizon=4", "wm.max_disagreement=100"]
"""a world model that trains in a second; no disagreement gate, so imagined branches run to the horizon"""
TINY_RL = ["learner.batch_segments=2", "learner.epochs=1", "learner.minibatches=1", "rollout.segment_len=2",
           "imagination.num_envs=2", "eval.test_episodes_per_task=4", "bc.batch_size=8", "bc.augment_shift_px=0",
           "runtime.driver_threads=1"]


def _outcome_dataset(root, features, episodes):
    """Image dataset by lerobot's API (two joints, one 16x16 camera, 30 fps); `episodes` lists per-frame dicts of
    the extra features."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.utils.utils import SuppressProgressBars

    feats = {"observation.images.front": {"dtype": "image", "shape": (16, 16, 3),
                                          "names": ["height", "width", "channels"]},
             "observation.state": {"dtype": "float32", "shape": (2,), "names": ["a.pos", "b.pos"]},
             "action": {"dtype": "float32", "shape": (2,), "names": ["a.pos", "b.pos"]}, **features}
    ds = LeRobotDataset.create("test/outcomes", fps=30, root=root, features=feats, use_videos=False)
    rng = np.random.default_rng(0)
    with SuppressProgressBars():
        for frames in episodes:
            for t, extra in enumerate(frames):
                ds.add_frame({"observation.images.front": rng.integers(0, 256, (16, 16, 3), np.uint8),
                              "observation.state": np.full(2, t, np.float32), "action": np.full(2, t + 1.0, np.float32),
                              "task": "push", **extra})
            ds.save_episode()
    ds.finalize()
    return root


def _policy_params(path):
    from acce.checkpoint import load_checkpoint
    return load_checkpoint(path)["learner"]["policy"]["state_dict"]


@needs_video
def test_dataset_clone_world_model_imagined_rl_and_serve(tmp_path, capsys):
    from acce.cli import main
    from acce.store import EpisodeStore
    from robot_bridge.cli import main as bridge_main

    data, _ = _write(tmp_path / "so101", _joint_features({"observation.images.front": "video",
                                                          "observation.images.wrist": "video"}), episodes=3, frames=8)
    args = ["train", "--data", str(data), "--quiet", f"run.out_dir={tmp_path}", "run.name=arm",
            "dataset.image_size=16", "bc.steps=2", "dataset.wm_steps=3", "train.max_versions=3",
            "dataset.heldout_fraction=0.34", *TINY_POLICY, *TINY_WM, *TINY_RL]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    run = tmp_path / "arm"

    # labels: teleoperated demos without next.success succeed at their last step (dataset.success=auto)
    assert summary["labels"] == {"success": "last_step", "successful_episodes": 3, "episodes": 3,
                                 "reward": "1 at a success step"}
    # the world model is built for the dataset's spec and trained on the two training episodes
    from worldmodel.model import WorldModel
    wm = WorldModel.load(run / "wm" / "worldmodel.pt")
    assert (wm.state_dim, wm.action_dim, wm.cameras, wm.cfg.image_size, wm.control_hz) == (
        6, 6, ("front", "wrist"), 16, 30.0)
    assert summary["wm"]["wm_version"] == 3 and summary["wm"]["episodes"] == {"train": 2, "val": 1}

    # RL in imagination: the learner advanced on imagined segments only, and its weights moved
    rl = summary["rl"]
    assert rl["versions"] >= 3 and rl["updates"] >= 3 and rl["source"] == "imagined" and rl["wm_version"] == 3
    assert rl["consumed_imagined_steps"] > 0 and rl["consumed_sim_steps"] == 0
    before, after = _policy_params(run / "checkpoints" / "bc.pt"), _policy_params(run / "checkpoints" / "latest.pt")
    assert any(not np.allclose(before[k].numpy(), after[k].numpy()) for k in before)

    # evaluation: open loop for version 0 and the final policy, imagined success labelled as such for both
    ev, im = summary["eval"], summary["imagined"]
    assert "not a success rate" in ev["label"] and ev["version"] == rl["versions"]
    assert ev["heldout"]["episodes"] == ev["v0"]["heldout"]["episodes"] == 1
    assert "imagined" in im["label"] and "not a measured success rate" in im["label"]
    assert im["start_states"] == "heldout" and im["v0"]["n"] == im["final"]["n"] == 4
    assert (im["v0"]["version"], im["final"]["version"]) == (0, rl["versions"])
    assert 0.0 <= im["final"]["success_rate"] <= 1.0
    written = json.loads((run / "summary.json").read_text())
    assert written["imagined"] == im and written["rl"]["versions"] == rl["versions"]

    from acce.dataset_train import format_summary
    text = format_summary(summary)
    assert "RL in imagination (source=imagined, no simulator)" in text and "imagined success" in text

    # the RL checkpoint serves the dataset's joints: a mock robot with its features gets 6-d actions
    out = tmp_path / "robot"
    assert bridge_main(["robot", "--robot", "mock", "--checkpoint", str(run), "--max-steps", "5",
                        "--instruction", "pick the cube 0", "--out", str(out)]) == 0
    recorded = EpisodeStore.open(out / "episodes.zarr")
    assert recorded.schema.env_spec.action_names == JOINTS and recorded[0].action.shape[1:] == (6,)


@pytest.mark.filterwarnings("ignore:Converting input from bool")
def test_labels_from_lerobot_outcomes_and_per_episode_features(tmp_path):
    from acce.config import load
    from acce.dataset_labels import apply_labels, episode_flags, resolve_success
    from acce.dataset_rl import world_model_arrays
    from acce.store.lerobot_import import import_lerobot

    # next.success / next.reward (LeRobot's outcome features): mapped onto the transitions; a success flagged on
    # the last frame (whose action the import drops) is the last transition's
    outcome = {"next.success": {"dtype": "bool", "shape": (1,), "names": None},
               "next.reward": {"dtype": "float32", "shape": (1,), "names": None}}
    rows = [[{"next.success": np.array([s]), "next.reward": np.array([r], np.float32)}
             for s, r in zip([False, False, False, True], [0.0, 0.5, 0.0, 1.0])]]
    src = _outcome_dataset(tmp_path / "with_outcomes", outcome, rows)
    cfg = load(None, [f"dataset.path={src}"]).dataset
    assert resolve_success(cfg) == "data"
    store = import_lerobot(src, tmp_path / "a.zarr", config=cfg)
    ep = store[0]
    assert ep.success.tolist() == [False, False, True] and ep.reward.tolist() == [0.0, 0.5, 0.0]
    (arrays,), labels = apply_labels(world_model_arrays([ep], store.schema.env_spec), "data")
    assert arrays.terminated.tolist() == [False, False, True] and arrays.reward.tolist() == [0.0, 0.5, 0.0]
    assert labels == {"success": "data", "successful_episodes": 1, "episodes": 1, "reward": "recorded"}

    # no outcome features: a per-episode feature (true at the last frame of the episodes that worked), or
    # every episode a success at its last step ("auto" = "last_step" here), or none
    ok = {"episode_ok": {"dtype": "float32", "shape": (1,), "names": None}}
    rows = [[{"episode_ok": np.array([v], np.float32)} for v in values]
            for values in ([0, 0, 1], [0, 0, 0, 0], [1, 1])]  # episodes of 2, 3 and 1 transitions
    src = _outcome_dataset(tmp_path / "teleop", ok, rows)
    cfg = load(None, [f"dataset.path={src}", "dataset.success=episode_ok"]).dataset
    assert resolve_success(cfg) == "episode_ok"
    store = import_lerobot(src, tmp_path / "b.zarr", config=cfg)  # the label feature is mapped, not refused
    eps = list(store.iter_episodes())
    assert not any(e.success.any() or e.reward.any() for e in eps)
    flags = episode_flags(cfg, "episode_ok", len(eps))
    assert flags.tolist() == [True, False, True]
    arrays = world_model_arrays(eps, store.schema.env_spec)
    labelled, labels = apply_labels(arrays, "episode_ok", flags)
    assert [a.success.tolist() for a in labelled] == [[False, True], [False, False, False], [True]]
    assert [a.terminated.tolist() for a in labelled] == [[False, True], [False, False, False], [True]]
    assert [a.reward.tolist() for a in labelled] == [[0.0, 1.0], [0.0, 0.0, 0.0], [1.0]]
    assert labels == {"success": "episode_ok", "successful_episodes": 2, "episodes": 3,
                      "reward": "1 at a success step"}
    assert resolve_success(load(None, [f"dataset.path={src}"]).dataset) == "last_step"
    labelled, labels = apply_labels(arrays, "last_step")
    assert [a.success.tolist() for a in labelled] == [[False, True], [False, False, True], [True]]
    labelled, labels = apply_labels(arrays, "none")
    assert labels["successful_episodes"] == 0 and not any(a.reward.any() for a in labelled)
    assert not any(a.success.any() for a in arrays)  # the episodes themselves are left as they were


def test_a_missing_success_feature_is_one_error_before_anything_is_written(tmp_path):
    from acce.config import load
    from acce.dataset_train import train_on_dataset

    src = _outcome_dataset(tmp_path / "data", {}, [[{}, {}, {}]])
    base = [f"dataset.path={src}", f"run.out_dir={tmp_path}", "run.name=run", "bc.steps=1", "dataset.wm_steps=1",
            "dataset.image_size=16", *TINY_POLICY]
    with pytest.raises(ConfigError, match=r"dataset.success='episode_ok' is not a feature of .*observation.state"):
        train_on_dataset(load(None, base + ["dataset.success=episode_ok"]), progress=False)
    with pytest.raises(ConfigError, match="dataset.success='observation.state' is a float32 feature of shape"):
        train_on_dataset(load(None, base + ["dataset.success=observation.state"]), progress=False)
    with pytest.raises(ConfigError, match="needs a world model: set dataset.wm_steps > 0"):
        train_on_dataset(load(None, base + ["dataset.wm_steps=0", "train.max_versions=5"]), progress=False)
    with pytest.raises(ConfigError, match="power of two >= 16: set dataset.image_size"):
        train_on_dataset(load(None, base + ["dataset.image_size=24"]), progress=False)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="nothing to maximize"):
        train_on_dataset(load(None, base + ["dataset.success=none", "train.max_versions=5"]), progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "summary.json").exists()
