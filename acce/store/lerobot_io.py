"""EpisodeStore <-> LeRobotDataset v3, written and read only through lerobot's `LeRobotDataset` class.

Images are stored as PNG inside the parquet files (use_videos=False): lossless, so uint8 pixels round-trip
bit-exactly and no FFmpeg is needed. lerobot is imported inside the functions, never when `acce.store` loads.

One acce episode (T transitions, T + 1 observations) is one LeRobot episode of T + 1 frames. Frame t holds
observation t and the transition that starts there; the final frame (t = T) has zero action, all `next.*` zero /
False and `acce.is_final_frame` True, so LeRobot consumers can mask it. Columns:

    observation.images.<camera>  image (H, W, 3)     observation.state  float32 (S,)     action  float32 (A,)
    next.reward float32     next.done (= terminated | truncated), next.terminated, next.truncated, next.success  bool
    acce.behavior_version int64   acce.delay_steps int32   acce.policy_sampled bool   acce.timestamp_s float64
    acce.is_final_frame bool      acce.task_id, acce.seed, acce.wm_version int64 (per episode, repeated per frame)
    acce.task, acce.source, acce.episode_id  string (per episode, repeated; parquet dictionary-encodes them)
    acce.aux  float32 (P,), only for stores with aux_dim = P > 0 (the sim's privileged aux labels)
    task (LeRobot's own per-frame task string) = the episode's instruction

LeRobot's `timestamp` is its usual frame_index / fps; the recorded wall-clock time is `acce.timestamp_s` (float64,
which LeRobot's float32 timestamp could not hold). Keeping per-episode fields as columns keeps everything in
LeRobot's own files, so LeRobot's episode selection and merging tools carry them along. The store schema that
LeRobot has no place for (exact control_hz, `extra`) goes to `meta/acce.json`; LeRobot ignores that file.

Importing any LeRobotDataset (acce's own exports and every other) is `acce.store.lerobot_import`.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from acce.store.episodes import EpisodeStore, StoreSchema
from acce.types import AUX_KEY, IMAGE_PREFIX, SOURCES, STATE_KEY, Episode

CAMERA_PREFIX = "observation.images."
SIDECAR = "meta/acce.json"
AUX_COLUMN = "acce.aux"
"""store schema that LeRobot's info.json has no place for"""
_SCALARS: dict[str, tuple[str, str]] = {
    # LeRobot column -> (Episode field, dtype) for (T,) transition fields; the final frame is padded.
    "next.reward": ("reward", "float32"),
    "next.terminated": ("terminated", "bool"),
    "next.truncated": ("truncated", "bool"),
    "next.success": ("success", "bool"),
    "acce.behavior_version": ("behavior_version", "int64"),
    "acce.delay_steps": ("delay_steps", "int32"),
    "acce.policy_sampled": ("policy_sampled", "bool"),
}
_PER_EPISODE: dict[str, str] = {"acce.task_id": "int64", "acce.seed": "int64", "acce.wm_version": "int64",
                                "acce.task": "string", "acce.source": "string", "acce.episode_id": "string"}


def _features(schema: StoreSchema) -> dict[str, dict[str, Any]]:
    """LeRobot feature spec for a store schema."""
    feats: dict[str, dict[str, Any]] = {
        f"{CAMERA_PREFIX}{cam}": {"dtype": "image", "shape": (h, w, 3), "names": ["height", "width", "channels"]}
        for cam, (h, w) in schema.image_shapes.items()}
    feats["observation.state"] = {"dtype": "float32", "shape": (schema.state_dim,),
                                  "names": list(schema.state_names) or [f"state_{i}" for i in range(schema.state_dim)]}
    feats["action"] = {"dtype": "float32", "shape": (schema.action_dim,),  # in [-1, 1]; units in meta/acce.json
                       "names": list(schema.action_names) or [f"action_{i}" for i in range(schema.action_dim)]}
    columns = {**{k: d for k, (_, d) in _SCALARS.items()}, "next.done": "bool", "acce.timestamp_s": "float64",
               "acce.is_final_frame": "bool", **_PER_EPISODE}
    feats.update({k: {"dtype": d, "shape": (1,), "names": None} for k, d in columns.items()})
    if schema.aux_dim:
        feats[AUX_COLUMN] = {"dtype": "float32", "shape": (schema.aux_dim,),
                             "names": [f"aux_{i}" for i in range(schema.aux_dim)]}
    return feats


def _frame(ep: Episode, t: int, schema: StoreSchema) -> dict[str, Any]:
    """LeRobot frame t of an episode (t == T is the final observation, with padded transition columns)."""
    last = t == ep.num_steps
    frame: dict[str, Any] = {f"{CAMERA_PREFIX}{cam}": ep.obs[f"{IMAGE_PREFIX}{cam}"][t] for cam in schema.image_shapes}
    frame["observation.state"] = ep.obs[STATE_KEY][t].astype(np.float32)
    if schema.aux_dim:
        frame[AUX_COLUMN] = ep.obs[AUX_KEY][t].astype(np.float32)
    frame["action"] = (np.zeros(schema.action_dim) if last else ep.action[t]).astype(np.float32)
    for column, (name, dtype) in _SCALARS.items():
        frame[column] = np.zeros(1, dtype) if last else np.asarray([getattr(ep, name)[t]], dtype)
    if last:
        frame["acce.behavior_version"] = np.array([-1], np.int64)
    frame["next.done"] = frame["next.terminated"] | frame["next.truncated"]
    frame["acce.timestamp_s"] = np.asarray([ep.timestamp_s[t]], np.float64)
    frame["acce.is_final_frame"] = np.array([last])
    for column, dtype in _PER_EPISODE.items():
        value = getattr(ep, column.removeprefix("acce."))
        frame[column] = value if dtype == "string" else np.asarray([value], dtype)
    frame["task"] = ep.instruction
    return frame


def export_lerobot(store: EpisodeStore, out_dir: str | os.PathLike, repo_id: str = "acce/episodes") -> Path:
    """Write every episode of `store` as a new LeRobotDataset v3 at `out_dir` (which must not exist)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.utils.utils import SuppressProgressBars

    out_dir, schema = Path(out_dir), store.schema
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists; LeRobotDataset.create needs a new directory")
    if len(store) == 0:
        raise ValueError(f"episode store {store.path} is empty; a LeRobotDataset needs at least one episode")
    if float(schema.control_hz) != round(schema.control_hz):
        raise ValueError(f"control_hz={schema.control_hz} is not an integer, but LeRobotDataset's fps is; "
                         "record at an integer control rate to export")
    ds = LeRobotDataset.create(repo_id, fps=int(round(schema.control_hz)), root=out_dir,
                               features=_features(schema), use_videos=False)
    # LeRobot warns about histograms of bool columns and shows a progress bar per episode; neither helps here.
    with SuppressProgressBars(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Converting input from bool", category=RuntimeWarning)
        for ep in store.iter_episodes():
            for t in range(ep.num_steps + 1):
                ds.add_frame(_frame(ep, t, schema))
            ds.save_episode()
    ds.finalize()
    sidecar = {"format": "acce-episodes", "format_version": 1, "schema": schema.to_json()}
    (out_dir / SIDECAR).write_text(json.dumps(sidecar, indent=2))
    return out_dir


def _column(table: Any, name: str) -> np.ndarray:
    """One arrow column as numpy: fixed-size lists become (n, d); scalars (n,)."""
    col = table.column(name).combine_chunks()
    if hasattr(col.type, "list_size"):
        return np.asarray(col.flatten().to_numpy(zero_copy_only=False)).reshape(len(col), col.type.list_size)
    return np.asarray(col.to_numpy(zero_copy_only=False))
