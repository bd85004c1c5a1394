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

Datasets without the acce columns (e.g. teleoperated demos recorded with lerobot) import with: T = frames - 1
(the last frame's action is dropped), source "demo", reward / success / terminated from next.reward /
next.success / next.done when present (else 0 / False), the last transition truncated unless terminated,
behavior_version -1, delay 0, policy_sampled False, seed -1, task = instruction, task_id = LeRobot task_index,
episode_id "<repo_id>:<episode_index>", control_hz = fps. Actions must already be normalized to [-1, 1].
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
                                  "names": [f"state_{i}" for i in range(schema.state_dim)]}
    feats["action"] = {"dtype": "float32", "shape": (schema.action_dim,),
                       "names": [f"action_{i}" for i in range(schema.action_dim)]}
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


def _schema_of(ds: Any, src_dir: Path) -> StoreSchema:
    """Store schema for a dataset: from meta/acce.json when acce wrote it, else from LeRobot's features."""
    feats = ds.meta.features
    videos = [k for k, f in feats.items() if f["dtype"] == "video"]
    if videos:
        raise ValueError(f"{src_dir} stores {videos} as video; acce imports image datasets only (lossless pixels): "
                         "convert the videos to image features first")
    for key in ("observation.state", "action"):
        if key not in feats:
            raise ValueError(f"{src_dir} has no {key!r} feature; acce episodes need observation.state and action")
    shapes = {}
    for key, f in feats.items():
        if key.startswith(CAMERA_PREFIX):
            channels_first = (f.get("names") or [""])[0] in ("channel", "channels")
            shapes[key.removeprefix(CAMERA_PREFIX)] = tuple(f["shape"][1:3] if channels_first else f["shape"][:2])
    sidecar_path = src_dir / SIDECAR
    sidecar = json.loads(sidecar_path.read_text())["schema"] if sidecar_path.is_file() else {}
    return StoreSchema(image_shapes=shapes, state_dim=int(feats["observation.state"]["shape"][0]),
                       action_dim=int(feats["action"]["shape"][0]),
                       control_hz=float(sidecar.get("control_hz", ds.meta.fps)), extra=sidecar.get("extra", {}),
                       aux_dim=int(feats[AUX_COLUMN]["shape"][0]) if AUX_COLUMN in feats else 0,
                       action_repr=str(sidecar.get("action_repr", "")),
                       max_step_m=float(sidecar.get("max_step_m", 0.0)))


def _episode(ds: Any, table: Any, schema: StoreSchema, index: int, repo_id: str) -> Episode:
    """Rebuild one acce Episode from the arrow rows of one LeRobot episode."""
    n, names = table.num_rows, set(table.column_names)
    t = n - 1
    obs = {STATE_KEY: _column(table, "observation.state").astype(np.float32)}
    if schema.aux_dim:
        obs[AUX_KEY] = _column(table, AUX_COLUMN).astype(np.float32)
    for cam in schema.image_shapes:
        key = f"{CAMERA_PREFIX}{cam}"
        decode = ds.hf_dataset.features[key].decode_example  # the datasets Image feature: PNG bytes -> PIL
        obs[f"{IMAGE_PREFIX}{cam}"] = np.stack([np.asarray(decode(v).convert("RGB"), np.uint8)
                                                for v in table.column(key).to_pylist()])
    # One instruction per acce episode: the task of the episode's first frame.
    task_index = int(_column(table, "task_index")[0])
    instruction = str(ds.meta.tasks.iloc[task_index].name)
    fields: dict[str, Any] = {}
    for column, (name, dtype) in _SCALARS.items():
        fields[name] = _column(table, column)[:t].astype(dtype) if column in names else np.zeros(t, dtype)
    if "acce.is_final_frame" in names:
        final = _column(table, "acce.is_final_frame")
        if not final[-1] or final[:-1].any():
            raise ValueError("acce.is_final_frame must be set on its last frame only")
        per_episode = {c.removeprefix("acce."): _column(table, c)[0] for c in _PER_EPISODE}
        timestamp_s = _column(table, "acce.timestamp_s").astype(np.float64)
    else:
        if "next.done" in names:
            fields["terminated"] = _column(table, "next.done")[:t].astype(bool)
        if t > 0:
            fields["truncated"][-1] = not fields["terminated"][-1]
        fields["behavior_version"] = np.full(t, -1, np.int64)
        per_episode = {"task_id": task_index, "seed": -1, "wm_version": -1, "task": instruction, "source": "demo",
                       "episode_id": f"{repo_id}:{index}"}
        timestamp_s = _column(table, "timestamp").astype(np.float64)
    if per_episode["source"] not in SOURCES:
        raise ValueError(f"acce.source={per_episode['source']!r} is not one of {SOURCES}")
    return Episode(obs=obs, action=_column(table, "action")[:t].astype(np.float32), timestamp_s=timestamp_s,
                   instruction=instruction, task=str(per_episode["task"]),
                   task_id=int(per_episode["task_id"]), source=str(per_episode["source"]),
                   seed=int(per_episode["seed"]), episode_id=str(per_episode["episode_id"]),
                   wm_version=int(per_episode["wm_version"]), **fields)


def import_lerobot(src_dir: str | os.PathLike, store_path: str | os.PathLike,
                   repo_id: str | None = None) -> EpisodeStore:
    """Append every episode of the LeRobotDataset at `src_dir` to the store at `store_path` (created if needed).

    An existing store must have the dataset's schema (unless it is empty). If any episode does not fit, the episodes
    appended so far are truncated away again, so a failed import leaves the store as it was (and no new store).
    """
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    src_dir = Path(src_dir)
    # LeRobotDataset falls back to downloading from the hub when a local file is missing; acce never downloads.
    for pattern in ("meta/info.json", "meta/tasks.parquet", "meta/episodes/*/*.parquet", "data/*/*.parquet"):
        if not any(src_dir.glob(pattern)):
            raise FileNotFoundError(f"{src_dir} is not a complete local LeRobotDataset (nothing matches {pattern}); "
                                    "acce never downloads datasets: pass the local root of a finalized dataset")
    repo_id = repo_id or f"local/{src_dir.name}"
    ds = LeRobotDataset(repo_id, root=src_dir)
    schema = _schema_of(ds, src_dir)
    store = EpisodeStore.open_or_create(store_path, **{**schema.to_json(), "extra": schema.extra or None})
    # Arrow rows keep parquet's dtypes (float64 stays float64; the numpy/torch formats would cast to float32).
    rows = ds.hf_dataset.with_format("arrow")
    committed = len(store)
    with store.removed_if_failed_empty():  # a store this import created goes again if nothing was imported
        try:
            for index in range(ds.meta.total_episodes):
                meta = ds.meta.episodes[index]
                table = rows[int(meta["dataset_from_index"]):int(meta["dataset_to_index"])]
                store.append(_episode(ds, table, schema, index, repo_id))
        except ValueError as err:
            # Episodes are converted one at a time (a dataset may not fit in memory); undo the partial import.
            store.truncate(committed)
            raise ValueError(f"{src_dir}, LeRobot episode {index}: {err}; nothing was imported") from None
    return store
