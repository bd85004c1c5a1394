"""Episode outcomes for `acce train --data` (`dataset.success`): the success, termination and reward labels the world
model's heads learn, so that imagined episodes have a reward and a success without a simulator.

A robot's dataset rarely says whether an episode worked. LeRobot datasets that do carry `next.success` /
`next.reward` (the import maps them onto the episode's fields, `acce.store.lerobot_import`); an acce episode store
has its recorded labels. Otherwise the user says it per episode: "last_step" (teleoperated demos: every episode
ends in success), "none", or a dataset feature that is true at the last frame of the episodes that succeeded.

The labels follow the simulator's conventions (sim/env.py): success ends an episode (terminated), and when the data
has no rewards at all (none recorded, or all zero) the reward is 1 at a success step and 0 elsewhere, the sparse
reward that RL in imagination then maximizes. The labels are applied to the world model's copies of the episodes,
never to the run's store (a second run with another `dataset.success` reuses the same import).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from acce.configlib import ConfigError
from acce.data_config import DatasetConfig, SUCCESS_LABELS
from acce.data_kind import data_kind

LABEL_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float32", "float64")
"""feature dtypes a per-episode success label may have (true = non-zero)"""


def _features(src: Path) -> dict[str, Any]:
    """The LeRobotDataset's features from meta/info.json."""
    return json.loads((src / "meta" / "info.json").read_text()).get("features", {})


def resolve_success(cfg: DatasetConfig) -> str:
    """What labels the run: "data" (the data's own outcomes), "last_step", "none", or a feature name, checked
    against the dataset before anything is imported or written (one ConfigError naming dataset.success)."""
    src = Path(cfg.path)
    features = _features(src) if data_kind(src) == "lerobot" else None
    mode = cfg.success
    if mode == "auto":
        return "data" if features is None or {"next.success", "next.reward"} & set(features) else "last_step"
    if mode in SUCCESS_LABELS:
        return mode
    if features is None:
        raise ConfigError(f"dataset.success={mode!r} names a dataset feature, but {src} is not a LeRobotDataset "
                          f"(no meta/info.json); use dataset.success=auto (the recorded labels), last_step or none")
    if mode not in features:
        raise ConfigError(f"dataset.success={mode!r} is not a feature of {src} (its features: {sorted(features)}); "
                          "set dataset.success to the feature that marks a successful episode, or to auto, "
                          "last_step or none")
    dtype, shape = features[mode].get("dtype"), list(features[mode].get("shape") or [])
    if dtype not in LABEL_DTYPES or shape not in ([], [1]):
        raise ConfigError(f"dataset.success={mode!r} is a {dtype} feature of shape {shape}; a success label is one "
                          f"number or bool per frame ({', '.join(LABEL_DTYPES)}): name another feature")
    return mode


def episode_flags(cfg: DatasetConfig, feature: str, num_episodes: int) -> np.ndarray:
    """(num_episodes,) bool: the feature's value at each LeRobot episode's last frame is non-zero (read with
    lerobot's LeRobotDataset, in the order the import appended the episodes)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from acce.store.lerobot_io import _column

    src = Path(cfg.path)
    ds = LeRobotDataset(f"local/{src.name}", root=src, download_videos=False)
    values = _column(ds.hf_dataset.select_columns([feature]).with_format("arrow")[:], feature)
    values = np.asarray(values, np.float64).reshape(len(values), -1)[:, 0]
    last = [int(ds.meta.episodes[i]["dataset_to_index"]) - 1 for i in range(ds.meta.total_episodes)]
    if len(last) != num_episodes:
        raise ValueError(f"{src} has {len(last)} episodes but the run's import holds {num_episodes}; remove the "
                         "run's demos.zarr so the dataset is imported again")
    return values[last] != 0


def apply_labels(episodes: Sequence[Any], mode: str, flags: np.ndarray | None = None) -> tuple[list[Any], dict]:
    """Copies of the world model's episodes (worldmodel.data.EpisodeArrays: reward, terminated, success per
    transition) labelled by `mode` (resolve_success; `flags` for a feature), and a summary of the labels."""
    has_reward = any(np.any(np.asarray(ep.reward) != 0) for ep in episodes)
    out = []
    for k, ep in enumerate(episodes):
        success = np.asarray(ep.success, bool).reshape(-1).copy()
        if mode != "data":
            success[:] = False
            if success.size and (mode == "last_step" or (flags is not None and flags[k])):
                success[-1] = True
        terminated = np.asarray(ep.terminated, bool).reshape(-1) | success  # success ends an episode (as in sim)
        reward = np.asarray(ep.reward, np.float32).reshape(-1) if has_reward else success.astype(np.float32)
        out.append(dataclasses.replace(ep, success=success, terminated=terminated, reward=reward))
    summary = {"success": mode, "successful_episodes": int(sum(bool(ep.success.any()) for ep in out)),
               "episodes": len(out), "reward": "recorded" if has_reward else "1 at a success step"}
    return out, summary
