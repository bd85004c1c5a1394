"""Any LeRobotDataset v3 -> acce episodes, read only through lerobot's own `LeRobotDataset` class.

Which features become what is `DatasetConfig` (`dataset.*`; LeRobot's conventions by default). Image features are
decoded from their PNG bytes, video features by lerobot's `decode_video_frames`: torchcodec, which needs the FFmpeg
libraries scripts/setup.sh installs, or PyAV (lerobot's "pyav" backend, its own FFmpeg inside the wheel) with one
warning when torchcodec cannot load them; every camera is resized to `dataset.image_size` with the function a robot's
cameras go through at deployment (`acce.images.resize_square`).

The import also records the actions' data-derived rate limits in the store (acce/action_rates.py), which `acce robot`
uses as its default safety.max_rate.

Actions (docs/design.md §11): the policy acts in [-1, 1]. A dataset in its robot's units (degrees, radians, ...) is
mapped per dim with `a = 2 (x - low) / (high - low) - 1`, low / high being the data's per-dim range (or
`dataset.action_low/high`), and that range is recorded as the env spec's `action_low` / `action_high` together with
the feature names, so a served policy's robot sends `low + (a + 1) / 2 (high - low)`: the dataset's own units.

One LeRobot episode of N frames is one acce episode of T = N - 1 transitions (the last frame's action is dropped).
Datasets acce exported (meta/acce.json) round-trip exactly: their acce.* columns restore every field. Others import
as source "demo": reward / success / terminated from next.reward / next.success / next.done when present (else 0 /
False; a next.success on the last frame counts for the last transition), the last transition truncated unless
terminated, behavior_version -1, delay 0, policy_sampled False, seed
-1, task = instruction, task_id = LeRobot task_index, episode_id "<repo_id>:<episode_index>", control_hz = fps.

Nothing half-written: keys, feature shapes and action ranges are checked before the store is touched; an episode
that fails later (a damaged video) undoes the whole import, and a store the import created is removed again.
"""
from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from acce.action_rates import record_action_rates, store_action_rates
from acce.data_config import DatasetConfig
from acce.images import resize_square
from acce.store.episodes import EpisodeStore, StoreSchema
from acce.store.lerobot_io import _PER_EPISODE, _SCALARS, AUX_COLUMN, CAMERA_PREFIX, SIDECAR, _column
from acce.types import AUX_KEY, IMAGE_PREFIX, SOURCES, STATE_KEY, Episode

logger = logging.getLogger(__name__)

BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")
"""LeRobot's own per-frame columns (every dataset has them; nothing to map)"""
OUTCOMES = ("next.reward", "next.done", "next.success", "next.terminated", "next.truncated")
"""LeRobot outcome columns acce reads when present"""
FFMPEG_PACKAGES = ("libavcodec59 libavformat59 libavutil57 libswscale6 libswresample4 libavdevice59 libavfilter8")
"""Debian 12's FFmpeg 5 libraries, which torchcodec (lerobot's video decoder) loads; scripts/setup.sh installs them"""


@dataclass(frozen=True)
class Mapping:
    """The resolved mapping of one dataset: its features -> acce's episode fields, and the store schema."""

    cameras: dict[str, str]
    """acce camera -> dataset feature"""
    videos: frozenset[str]
    """the mapped camera features stored as video"""
    schema: StoreSchema
    acce_columns: bool
    """the dataset carries acce's own columns (acce exported it)"""
    normalize: bool
    """map the data's actions from [action_low, action_high] onto [-1, 1] (dataset.action_norm minmax)"""


def _names(feature: dict[str, Any], width: int) -> tuple[str, ...]:
    """A feature's per-dim names: a list, or lerobot's older {"motors": [...]} form; () when there are none."""
    names = feature.get("names")
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    if isinstance(names, (list, tuple)) and len(names) == width and all(isinstance(n, str) for n in names):
        return tuple(names)
    return ()


def _hw(feature: dict[str, Any]) -> tuple[int, int]:
    channels_first = (feature.get("names") or [""])[0] in ("channel", "channels")
    shape = feature["shape"]
    return (int(shape[1]), int(shape[2])) if channels_first else (int(shape[0]), int(shape[1]))


def _action_range(actions: np.ndarray, cfg: DatasetConfig, names: tuple[str, ...]) -> tuple[tuple, tuple]:
    """(low, high) per dim that map onto [-1, 1]: the configured bounds (every action must lie inside) or the
    data's range (a dim that never moves gets +-1 unit around its value, so it maps to 0)."""
    label = [f"{i} ({n})" if n else str(i) for i, n in enumerate(names or [""] * actions.shape[1])]
    if cfg.action_low:
        low, high = np.asarray(cfg.action_low), np.asarray(cfg.action_high)
        if low.shape != (actions.shape[1],):
            raise ValueError(f"dataset.action_low/high have {low.size} values, the actions {actions.shape[1]} dims")
        for i in range(actions.shape[1]):
            if actions[:, i].min() < low[i] or actions[:, i].max() > high[i]:
                raise ValueError(f"action dim {label[i]} spans [{actions[:, i].min():g}, {actions[:, i].max():g}], "
                                 f"outside dataset.action_low/high [{low[i]:g}, {high[i]:g}]: widen them")
        return tuple(low), tuple(high)
    low, high = actions.min(0).astype(np.float64), actions.max(0).astype(np.float64)
    flat = high - low < 1e-6
    return tuple(np.where(flat, low - 1.0, low)), tuple(np.where(flat, high + 1.0, high))


def resolve(ds: Any, cfg: DatasetConfig, src_dir: Path, actions: np.ndarray) -> Mapping:
    """Check every key of the dataset against the mapping and build the store schema (raises one ValueError naming
    the key and the `dataset.*` override that fixes it)."""
    feats = ds.meta.features
    sidecar_path = src_dir / SIDECAR
    sidecar = json.loads(sidecar_path.read_text())["schema"] if sidecar_path.is_file() else {}
    acce_columns = "acce.is_final_frame" in feats
    cameras = dict(cfg.cameras) or {k.removeprefix(CAMERA_PREFIX): k for k, f in feats.items()
                                     if k.startswith(CAMERA_PREFIX) and f["dtype"] in ("image", "video")}
    for cam, key in cameras.items():
        if key not in feats or feats[key]["dtype"] not in ("image", "video"):
            images = sorted(k for k, f in feats.items() if f["dtype"] in ("image", "video"))
            raise ValueError(f"dataset.cameras maps camera {cam!r} to {key!r}, which is not an image or video "
                             f"feature of {src_dir} (it has {images}); fix dataset.cameras")
    if not cameras:
        raise ValueError(f"{src_dir} has no observation.images.* feature; name its camera features with "
                         "dataset.cameras={<camera>: <feature>} (acce policies need at least one camera)")
    for key, option in ((cfg.state_key, "state_key"), (cfg.action_key, "action_key")):
        if key not in feats or feats[key]["dtype"] not in ("float32", "float64") or len(feats[key]["shape"]) != 1:
            floats = sorted(k for k, f in feats.items() if f["dtype"] in ("float32", "float64"))
            raise ValueError(f"{src_dir} has no float vector feature {key!r} for acce's "
                             f"{option.removesuffix('_key')}; set dataset.{option}=<feature> (its float features: "
                             f"{floats})")
    if cfg.instruction_key != "task" and cfg.instruction_key not in feats:
        raise ValueError(f"{src_dir} has no feature {cfg.instruction_key!r} for the instruction; set "
                         "dataset.instruction_key=task (LeRobot's task strings) or to one of its string features")
    used = {*cameras.values(), cfg.state_key, cfg.action_key, cfg.instruction_key, *BOOKKEEPING, *OUTCOMES,
            *cfg.ignore, cfg.success}  # dataset.success may name a label feature (acce.dataset_labels reads it)
    unmapped = sorted(k for k in feats if k not in used and not (acce_columns and k.startswith("acce.")))
    if unmapped:
        raise ValueError(f"{src_dir} has feature(s) {unmapped} that acce does not map; leave them out with "
                         f"dataset.ignore=[{','.join(unmapped)}] or map them (dataset.cameras / dataset.state_key / "
                         "dataset.action_key)")
    shapes = {cam: _hw(feats[key]) for cam, key in cameras.items()}
    if cfg.image_size:  # else kept: a store holds any size, but only one square size has an env spec (a policy)
        shapes = {cam: (cfg.image_size, cfg.image_size) for cam in shapes}
    state_dim, action_dim = int(feats[cfg.state_key]["shape"][0]), int(feats[cfg.action_key]["shape"][0])
    if sidecar:  # acce exported it: the recorded schema, exactly (its feature names may be placeholders)
        state_names, action_names = tuple(sidecar.get("state_names", ())), tuple(sidecar.get("action_names", ()))
    else:
        state_names, action_names = _names(feats[cfg.state_key], state_dim), _names(feats[cfg.action_key], action_dim)
    if not np.all(np.isfinite(actions)):
        rows = np.flatnonzero(~np.isfinite(actions).all(1))
        raise ValueError(f"{src_dir}'s {cfg.action_key!r} has NaN/inf in {rows.size} frame(s) (dataset index "
                         f"{int(rows[0])} first); clean or drop those episodes before importing")
    norm = cfg.action_norm if cfg.action_norm != "auto" else ("none" if sidecar else "minmax")
    units: dict[str, Any] = {"state_names": state_names, "action_names": action_names}
    if norm == "minmax":
        units["action_low"], units["action_high"] = _action_range(actions, cfg, action_names)
    else:
        units.update({n: tuple(sidecar.get(n, ())) for n in ("action_low", "action_high")})
        worst = float(np.abs(actions).max(initial=0.0))
        if worst > 1.0 + 1e-6:
            raise ValueError(f"{src_dir}'s actions reach |a| = {worst:g}, outside [-1, 1], but dataset.action_norm="
                             f"{cfg.action_norm} imports them as they are; set dataset.action_norm=minmax to map "
                             "each dim's range onto [-1, 1]")
    repr_ = cfg.action_repr or (str(sidecar.get("action_repr", "")) if sidecar else (
        "joint_pos_abs" if action_names and all(n.endswith(".pos") for n in action_names) else "normalized"))
    robot_type = getattr(ds.meta, "robot_type", None)
    extra = sidecar.get("extra") or ({"lerobot_robot_type": robot_type} if robot_type else {})
    schema = StoreSchema(image_shapes=shapes, state_dim=state_dim, action_dim=action_dim,
                         control_hz=float(sidecar.get("control_hz", ds.meta.fps)), extra=extra,
                         aux_dim=int(feats[AUX_COLUMN]["shape"][0]) if AUX_COLUMN in feats else 0,
                         action_repr=repr_, max_step_m=float(sidecar.get("max_step_m", 0.0)), **units)
    videos = frozenset(k for k in cameras.values() if feats[k]["dtype"] == "video")
    return Mapping(cameras, videos, schema, acce_columns, norm == "minmax")


def _decode_video(ds: Any, key: str, index: int, timestamps: list[float], backend: str) -> np.ndarray:
    """(N, H, W, 3) uint8 frames of one episode's video at the given timestamps (lerobot's decoder, `backend`)."""
    import torch
    from lerobot.datasets.video_utils import decode_video_frames

    ep = ds.meta.episodes[index]
    path = ds.root / ds.meta.get_video_file_path(index, key)
    offset = float(ep[f"videos/{key}/from_timestamp"])
    try:
        with warnings.catch_warnings():  # torchvision's deprecation notice, per call; _video_backend said why PyAV
            warnings.filterwarnings("ignore", message="The video decoding and encoding capabilities of torchvision")
            frames = decode_video_frames(path, [offset + t for t in timestamps], ds.tolerance_s, backend)
    except Exception as err:  # torchcodec / av raise many types for a damaged file; all mean "cannot read it"
        raise ValueError(f"cannot decode {key} of episode {index} from {path} ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}); the video file is damaged or "
                         "incomplete: re-encode or re-record it") from None
    if frames.shape[0] != len(timestamps):
        raise ValueError(f"{path} gave {frames.shape[0]} frames of {key} for episode {index}'s {len(timestamps)}")
    return (frames.permute(0, 2, 3, 1).clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def _camera(ds: Any, table: Any, m: Mapping, cam: str, index: int, backend: str) -> np.ndarray:
    key = m.cameras[cam]
    if key in m.videos:
        frames = _decode_video(ds, key, index, _column(table, "timestamp").astype(np.float64).tolist(), backend)
    else:
        decode = ds.hf_dataset.features[key].decode_example  # the datasets Image feature: PNG bytes -> PIL
        frames = np.stack([np.asarray(decode(v).convert("RGB"), np.uint8) for v in table.column(key).to_pylist()])
    h, w = m.schema.image_shapes[cam]
    if frames.shape[1:3] != (h, w):
        frames = np.stack([resize_square(f, h) for f in frames])
    return frames


def _episode(ds: Any, table: Any, m: Mapping, cfg: DatasetConfig, index: int, repo_id: str,
             backend: str) -> Episode:
    """Rebuild one acce Episode from the arrow rows of one LeRobot episode."""
    schema, names = m.schema, set(table.column_names)
    t = table.num_rows - 1
    obs = {STATE_KEY: _column(table, cfg.state_key).astype(np.float32)}
    if schema.aux_dim:
        obs[AUX_KEY] = _column(table, AUX_COLUMN).astype(np.float32)
    for cam in schema.image_shapes:
        obs[f"{IMAGE_PREFIX}{cam}"] = _camera(ds, table, m, cam, index, backend)
    # One instruction per acce episode: the task (or instruction feature) of the episode's first frame.
    task_index = int(_column(table, "task_index")[0])
    instruction = (str(ds.meta.tasks.iloc[task_index].name) if cfg.instruction_key == "task"
                   else str(table.column(cfg.instruction_key)[0]))
    fields: dict[str, Any] = {}
    for column, (name, dtype) in _SCALARS.items():
        fields[name] = _column(table, column)[:t].astype(dtype) if column in names else np.zeros(t, dtype)
    if m.acce_columns:
        final = _column(table, "acce.is_final_frame")
        if not final[-1] or final[:-1].any():
            raise ValueError("acce.is_final_frame must be set on its last frame only")
        per_episode = {c.removeprefix("acce."): _column(table, c)[0] for c in _PER_EPISODE}
        timestamp_s = _column(table, "acce.timestamp_s").astype(np.float64)
    else:
        if "next.done" in names:
            fields["terminated"] = _column(table, "next.done")[:t].astype(bool)
        if "next.success" in names and t > 0:  # a success flagged on the last frame (whose action is dropped)
            fields["success"][-1] |= bool(_column(table, "next.success")[t])  # is the episode's outcome: keep it
        if t > 0:
            fields["truncated"][-1] = not fields["terminated"][-1]
        fields["behavior_version"] = np.full(t, -1, np.int64)
        per_episode = {"task_id": task_index, "seed": -1, "wm_version": -1, "task": instruction, "source": "demo",
                       "episode_id": f"{repo_id}:{index}"}
        timestamp_s = _column(table, "timestamp").astype(np.float64)
    if per_episode["source"] not in SOURCES:
        raise ValueError(f"acce.source={per_episode['source']!r} is not one of {SOURCES}")
    action = _column(table, cfg.action_key)[:t].astype(np.float64)
    if m.normalize:  # the data's units -> [-1, 1] (clipped against float rounding at the range's ends)
        lo, hi = np.asarray(schema.action_low), np.asarray(schema.action_high)
        action = np.clip(2.0 * (action - lo) / (hi - lo) - 1.0, -1.0, 1.0)
    return Episode(obs=obs, action=action.astype(np.float32), timestamp_s=timestamp_s,
                   instruction=instruction, task=str(per_episode["task"]),
                   task_id=int(per_episode["task_id"]), source=str(per_episode["source"]),
                   seed=int(per_episode["seed"]), episode_id=str(per_episode["episode_id"]),
                   wm_version=int(per_episode["wm_version"]), **fields)


def _load_torchcodec() -> None:
    """Import torchcodec's decoders, which loads FFmpeg's shared libraries (RuntimeError "Could not load
    libtorchcodec" when they are missing)."""
    import torchcodec.decoders  # noqa: F401


def _video_backend(ds: Any) -> str:
    """The dataset's video backend (torchcodec by default); PyAV, with one warning naming why, when torchcodec
    cannot load FFmpeg. Why not simply PyAV: torchcodec seeks frame-accurately and is lerobot's default."""
    if ds.video_backend != "torchcodec":
        return ds.video_backend
    try:
        _load_torchcodec()
    except (ImportError, OSError, RuntimeError) as err:
        why = str(err).splitlines()[0] if str(err) else ""
        logger.warning("video: torchcodec cannot load FFmpeg (%s: %s); decoding with PyAV instead (apt-get install "
                       "-y %s restores torchcodec)", type(err).__name__, why, FFMPEG_PACKAGES)
        return "pyav"
    return "torchcodec"


def import_lerobot(src_dir: str | os.PathLike, store_path: str | os.PathLike, repo_id: str | None = None,
                   config: DatasetConfig | None = None) -> EpisodeStore:
    """Append every episode of the LeRobotDataset at `src_dir` to the store at `store_path` (created if needed),
    mapped by `config` (LeRobot's conventions by default). An existing store must have the resulting schema (unless
    it is empty). A failure leaves the store as it was, and no new store."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    cfg = config or DatasetConfig()
    src_dir = Path(src_dir)
    # LeRobotDataset falls back to downloading from the hub when a local file is missing; acce never downloads.
    for pattern in ("meta/info.json", "meta/tasks.parquet", "meta/episodes/*/*.parquet", "data/*/*.parquet"):
        if not any(src_dir.glob(pattern)):
            raise FileNotFoundError(f"{src_dir} is not a complete local LeRobotDataset (nothing matches {pattern}); "
                                    "acce never downloads datasets: pass the local root of a finalized dataset")
    repo_id = repo_id or f"local/{src_dir.name}"
    ds = LeRobotDataset(repo_id, root=src_dir, download_videos=False)
    # Arrow rows keep parquet's dtypes (float64 stays float64; the numpy/torch formats would cast to float32).
    rows = ds.hf_dataset.with_format("arrow")
    actions = np.zeros((0, 1))  # the whole action column, without images, for the range check and min / max
    if cfg.action_key in rows.column_names:
        actions = _column(ds.hf_dataset.select_columns([cfg.action_key]).with_format("arrow")[:], cfg.action_key)
    m = resolve(ds, cfg, src_dir, actions.astype(np.float64).reshape(len(actions), -1))
    backend = _video_backend(ds) if m.videos else ""
    store = EpisodeStore.open_or_create(store_path, **{**m.schema.to_json(), "extra": m.schema.extra or None})
    committed = len(store)
    with store.removed_if_failed_empty():  # a store this import created goes again if nothing was imported
        index = 0
        try:
            for index in range(ds.meta.total_episodes):
                meta = ds.meta.episodes[index]
                table = rows[int(meta["dataset_from_index"]):int(meta["dataset_to_index"])]
                store.append(_episode(ds, table, m, cfg, index, repo_id, backend))
        except BaseException as err:
            # Episodes are converted one at a time (a dataset may not fit in memory); undo the partial import.
            store.truncate(committed)
            if isinstance(err, ValueError):
                raise ValueError(f"{src_dir}, LeRobot episode {index}: {err}; nothing was imported") from None
            raise
    record_action_rates(store, store_action_rates(store, cfg.max_rate_percentile, cfg.max_rate_margin))
    return store
