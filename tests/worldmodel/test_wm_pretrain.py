"""Offline pipeline on a tiny real dataset (scripted reach, 32x32): pretrain -> checkpoint -> wm-eval, zarr and
LeRobotDataset inputs, and the CLI."""
import argparse
import json

import numpy as np
import pytest
from wm_helpers import collect_reach_store, tiny_cfg

from acce.configlib import ConfigError
from worldmodel.cli import add_parsers, load_wm_config
from worldmodel.data import load_episodes
from worldmodel.evaluate import wm_eval
from worldmodel.model import WorldModel
from worldmodel.pretrain import pretrain


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("wm") / "reach.zarr"
    collect_reach_store(path, episodes=16)
    return path


@pytest.fixture(scope="module")
def pretrained(store_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("wm_out")
    return out, pretrain(store_path, out, tiny_cfg(val_fraction=0.25, lr=2e-3), steps=40, progress=False)


def test_pretraining_lowers_validation_loss(pretrained, store_path):
    out, summary = pretrained
    assert summary["val_loss_final"]["total"] < 0.8 * summary["val_loss_initial"]["total"]
    assert summary["episodes"] == {"train": 12, "val": 4} and summary["wm_version"] == 40
    model = WorldModel.load(out / "worldmodel.pt")
    info = model.data_info
    assert info["kind"] == "zarr" and info["num_episodes"] == 16 and len(info["val_episode_ids"]) == 4
    train_ids = {ep.episode_id for ep in load_episodes(store_path)[0]} - set(info["val_episode_ids"])
    assert len(train_ids) == 12  # split by episode: no episode on both sides
    assert json.loads((out / "pretrain.json").read_text())["steps"] == 40
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(out / "tb"))
    ea.Reload()
    assert {"wm/loss/total", "wm/val/total", "wm/version"} <= set(ea.Tags()["scalars"])
    assert "wm/frames/val" in ea.Tags()["images"]


def test_wm_eval_reports_open_loop_errors_and_a_strip(pretrained, store_path, tmp_path):
    out, _ = pretrained
    results = wm_eval(out, store_path, tmp_path / "eval.json", tmp_path / "strip.png")
    assert results["held_out"] == "checkpoint validation split" and results["episodes"] == 4
    assert set(results["horizons"]) == {"1", "4", "16"}
    h1 = results["horizons"]["1"]
    assert h1["n"] > 0 and 0 < h1["image_mse"] < 1 and h1["image_psnr_db"] > 0 and h1["state_rmse"] >= 0
    assert {"precision", "recall", "auroc", "average_precision", "positives"} <= set(results["success_head"])
    assert json.loads((tmp_path / "eval.json").read_text())["wm_version"] == 40
    from PIL import Image
    strip = np.asarray(Image.open(tmp_path / "strip.png"))
    assert strip.shape[0] == 2 * 32 + 2 and strip.shape[1] % 34 == 0


@pytest.mark.slow
def test_pretraining_reads_a_lerobot_dataset(store_path, tmp_path):
    from acce.store.episodes import EpisodeStore
    from acce.store.lerobot_io import export_lerobot
    lerobot_dir = export_lerobot(EpisodeStore.open(store_path), tmp_path / "lerobot")  # lerobot's own writer
    episodes, desc = load_episodes(lerobot_dir)
    originals, _ = load_episodes(store_path)
    assert desc["kind"] == "lerobot" and len(episodes) == len(originals) == 16
    for a, b in zip(episodes, originals):
        np.testing.assert_array_equal(a.images, b.images)
        np.testing.assert_array_equal(a.action, b.action)
        assert a.instruction == b.instruction and a.episode_id == b.episode_id
    summary = pretrain(lerobot_dir, tmp_path / "out", tiny_cfg(), steps=2, progress=False, tensorboard=False)
    assert WorldModel.load(summary["checkpoint"]).data_info["kind"] == "lerobot"


def test_data_and_config_mismatches_fail_with_the_fix(store_path, tmp_path):
    with pytest.raises(ValueError, match="wm.image_size"):
        pretrain(store_path, tmp_path / "o", tiny_cfg(image_size=64), steps=1, progress=False, tensorboard=False)
    with pytest.raises(FileNotFoundError, match="acce collect"):
        load_episodes(tmp_path)


def test_cli_pretrain_then_eval(store_path, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    small = [f"wm.{k}={v}" for k, v in tiny_cfg().__dict__.items() if k in
             ("image_size", "latent_dim", "channels", "hidden_dim", "ensemble_size", "batch_size", "seq_len")]
    args = parser.parse_args(["wm-pretrain", "--data", str(store_path), "--out", str(tmp_path / "wm"), "--steps", "2",
                              "--quiet", *small])
    assert args.fn(args) == 0
    args = parser.parse_args(["wm-eval", "--checkpoint", str(tmp_path / "wm"), "--data", str(store_path),
                              "--out", str(tmp_path / "e.json"), "--png", str(tmp_path / "e.png")])
    assert args.fn(args) == 0
    text = capsys.readouterr().out
    assert "validation loss" in text and "success_head" in text and (tmp_path / "e.png").is_file()


def test_cli_config_errors_name_the_full_key(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'wm.latent_dim'"):
        load_wm_config(None, ["wm.latent_dm=3"])
    with pytest.raises(ConfigError, match="wm.<field>"):
        load_wm_config(None, ["learner.lr=3"])
    preset = tmp_path / "p.yaml"
    preset.write_text("env:\n  image_size: 32\nwm:\n  image_size: 32\n  horizon: 4\n")
    cfg = load_wm_config(str(preset), ["wm.horizon=5"])
    assert (cfg.image_size, cfg.horizon) == (32, 5)
