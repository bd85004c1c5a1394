"""`acce train --data`: a robot's LeRobotDataset (written by lerobot's API) cloned into a checkpoint with an
open-loop evaluation on held-out episodes, which `acce robot` then runs on a robot with the dataset's features; the
robot's recording is an episode store `acce train --data` takes back."""
import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may touch the hub
pytest.importorskip("lerobot")

from acce.dataset_train import split_episodes  # noqa: E402
# shared SO-101 joint names and tiny policy; pytest puts this directory on sys.path (rootdir import mode)
from test_lerobot_any import JOINTS, TINY_POLICY  # noqa: E402

TINY = TINY_POLICY + ["bc.batch_size=8", "bc.augment_shift_px=0"]


def _image_dataset(root, episodes=4, frames=8):
    """An SO-101-like dataset by lerobot's API: six joints in degrees, one 20x20 camera, 30 fps."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.utils.utils import SuppressProgressBars

    feats = {"observation.images.front": {"dtype": "image", "shape": (20, 20, 3),
                                          "names": ["height", "width", "channels"]},
             "observation.state": {"dtype": "float32", "shape": (6,), "names": list(JOINTS)},
             "action": {"dtype": "float32", "shape": (6,), "names": list(JOINTS)}}
    ds = LeRobotDataset.create("test/arm", fps=30, root=root, features=feats, use_videos=False)
    rng = np.random.default_rng(0)
    with SuppressProgressBars():
        for _ in range(episodes):
            for t in range(frames):
                joints = np.linspace(-90, 90, 6) * np.cos(t / 4) + rng.normal(0, 2, 6)
                ds.add_frame({"observation.images.front": rng.integers(0, 256, (20, 20, 3), np.uint8),
                              "observation.state": joints.astype(np.float32),
                              "action": (joints + 5.0).astype(np.float32), "task": "wave"})
            ds.save_episode()
    ds.finalize()
    return root


def test_split_holds_out_the_last_episodes():
    eps = list(range(10))
    assert split_episodes(eps, 0.1) == (eps[:9], [9])
    assert split_episodes(eps, 0.25) == (eps[:8], [8, 9])  # round(2.5) = 2
    assert split_episodes([0, 1], 0.1) == ([0], [1])  # at least one of two
    assert split_episodes([0], 0.5) == ([0], []) and split_episodes(eps, 0.0) == (eps, [])


def test_train_data_clones_evaluates_open_loop_and_the_checkpoint_drives_the_arm(tmp_path, capsys):
    from acce.cli import main
    from acce.store import EpisodeStore
    from robot_bridge.cli import main as bridge_main

    data = _image_dataset(tmp_path / "arm_data")
    args = ["train", "--data", str(data), "--quiet", f"run.out_dir={tmp_path}", "run.name=arm",
            "dataset.image_size=16", "bc.steps=4", "dataset.heldout_fraction=0.25", *TINY]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == {"train": 3, "heldout": 1} and summary["bc_steps"] == 4
    ev = summary["eval"]
    assert "not a success rate" in ev["label"] and ev["heldout"]["episodes"] == 1
    assert ev["heldout"]["decisions"] == 7 and set(ev["heldout"]["first_action_mae_per_dim"]) == set(JOINTS)
    assert np.isfinite([ev["heldout"]["mse"], ev["heldout"]["baseline_mse"]]).all()
    assert summary["env_spec"]["action_names"] == list(JOINTS) and summary["env_spec"]["control_hz"] == 30.0

    run = tmp_path / "arm"
    # the checkpoint carries the data-derived rate limits, so a copy of it alone keeps them
    from acce.checkpoint import load_checkpoint
    ckpt = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert len(ckpt["action_rates"]["max_rate"]) == 6
    # the world model pretrains on the same episodes (the run's import of the dataset)
    from worldmodel.cli import load_wm_config
    from worldmodel.pretrain import pretrain
    wm = pretrain(run / "demos.zarr", tmp_path / "wm", load_wm_config(None, ["wm.image_size=16"]), 2, progress=False)
    assert wm["episodes"]["val"] >= 1 and np.isfinite(wm["val_loss_final"]["total"])

    out = tmp_path / "robot"
    assert bridge_main(["robot", "--robot", "mock", "--checkpoint", str(run), "--max-steps", "6",
                        "--instruction", "wave", "--out", str(out)]) == 0
    recorded = EpisodeStore.open(out / "episodes.zarr")
    spec = recorded.schema.env_spec  # the recording carries the dataset's names and units
    assert spec.action_names == JOINTS and spec.action_low and recorded[0].source == "real"

    # the robot's recording goes back into training as it is (an acce episode store)
    assert main(["train", "--data", str(out / "episodes.zarr"), "--quiet", f"run.out_dir={tmp_path}",
                 "run.name=again", "bc.steps=1", *TINY]) == 0
    capsys.readouterr()
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert again["episodes"] == {"train": 1, "heldout": 0} and again["env_spec"] == summary["env_spec"]


def test_train_data_needs_a_cloning_budget(tmp_path):
    from acce.configlib import ConfigError
    from acce.config import load
    from acce.dataset_train import train_on_dataset

    with pytest.raises(ConfigError, match="bc.steps"):
        train_on_dataset(load(None, [f"dataset.path={tmp_path}", f"run.out_dir={tmp_path}"]), progress=False)
