"""What a robot run leaves behind, in `--out DIR`:

    DIR/episodes.zarr    acce episode store (acce.store.episodes): observations, executed actions, rewards, flags,
                         behavior_version, delay_steps, policy_sampled, timestamps; `acce collect`-compatible, and
                         exportable to LeRobotDataset with acce.store.lerobot_io.export_lerobot
    DIR/episodes.jsonl   one line per episode: what the store has no column for (safety events and counts, every
                         policy request with its measured latency, delay and server timing, stop reason, overruns)
    DIR/latency.json     measured inference latency of every request, {"latency_s": [...], ...}; train on it with
                         delay.model=empirical delay.path=DIR/latency.json (sim.latency.EmpiricalLatency.from_file)

Every file is rewritten or appended only after an episode is complete (the store commits atomically; the JSON file
is written to a temporary name and renamed), so an interrupted run never leaves a half-written episode.
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from acce.types import IMAGE_PREFIX, STATE_KEY, EnvSpec, Episode

MAX_EVENTS_PER_EPISODE = 2000
"""events kept per episode line; the rest are counted in "events_omitted" (counts stay exact)"""


class EpisodeBuilder:
    """Accumulates one episode: T + 1 observation frames and T transitions (the `Episode` frame convention)."""

    def __init__(self, *, instruction: str, task: str, task_id: int, seed: int, source: str):
        self.meta = {"instruction": instruction, "task": task, "task_id": int(task_id), "seed": int(seed),
                     "source": source}
        self.frames: list[dict[str, np.ndarray]] = []
        self.timestamps: list[float] = []
        self.steps: dict[str, list] = {k: [] for k in ("action", "reward", "terminated", "truncated", "success",
                                                       "behavior_version", "delay_steps", "policy_sampled")}

    @property
    def num_steps(self) -> int:
        return len(self.steps["action"])

    def observe(self, obs: dict[str, Any], wall_s: float) -> None:
        self.frames.append({k: np.asarray(v) for k, v in obs.items() if k.startswith(IMAGE_PREFIX) or k == STATE_KEY})
        self.timestamps.append(float(wall_s))

    def transition(self, **values: Any) -> None:
        for key, store in self.steps.items():
            store.append(values[key])

    def finish(self) -> Episode:
        if len(self.frames) != self.num_steps + 1:
            raise RuntimeError(f"episode has {len(self.frames)} frames for {self.num_steps} steps (needs T + 1)")
        obs = {k: np.stack([f[k] for f in self.frames]) for k in self.frames[0]}
        obs[STATE_KEY] = obs[STATE_KEY].astype(np.float32)
        s = self.steps
        ep = Episode(obs=obs, action=np.asarray(s["action"], np.float32).reshape(self.num_steps, -1),
                     reward=np.asarray(s["reward"], np.float32), terminated=np.asarray(s["terminated"], bool),
                     truncated=np.asarray(s["truncated"], bool), success=np.asarray(s["success"], bool),
                     behavior_version=np.asarray(s["behavior_version"], np.int64),
                     delay_steps=np.asarray(s["delay_steps"], np.int32),
                     policy_sampled=np.asarray(s["policy_sampled"], bool),
                     timestamp_s=np.asarray(self.timestamps, np.float64), episode_id=uuid.uuid4().hex, **self.meta)
        ep.validate()
        return ep


def latency_summary(latencies_s: list[float]) -> dict[str, float]:
    """n, p50, p90, p99, max in seconds (NaN when there is no measurement)."""
    if not latencies_s:
        return {"n": 0, "p50_s": float("nan"), "p90_s": float("nan"), "p99_s": float("nan"), "max_s": float("nan")}
    arr = np.asarray(latencies_s, np.float64)
    q = np.quantile(arr, [0.5, 0.9, 0.99])
    return {"n": int(arr.size), "p50_s": float(q[0]), "p90_s": float(q[1]), "p99_s": float(q[2]),
            "max_s": float(arr.max())}


def write_latency_file(path: str | os.PathLike, latencies_s: list[float], *, control_hz: float,
                       delay_steps: list[int] | None = None, **meta: Any) -> Path:
    """Write {"latency_s": [...], "control_hz", "source": "robot_bridge", summary..., **meta} atomically.

    The format is the one `sim.latency.EmpiricalLatency.from_file` reads: latencies in seconds, finite and >= 0.
    """
    values = [float(v) for v in latencies_s]
    if any(not np.isfinite(v) or v < 0 for v in values):
        raise ValueError("latencies must be finite and >= 0 seconds")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"latency_s": values, "control_hz": float(control_hz), "source": "robot_bridge",
            **latency_summary(values), **({"delay_steps": [int(d) for d in delay_steps]} if delay_steps else {}),
            **meta}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, default=_json_default))
    os.replace(tmp, path)
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


class RunRecorder:
    """The episode store, the episode log and the latency file of one `--out` directory."""

    def __init__(self, out_dir: str | os.PathLike, spec: EnvSpec):
        """spec: the policy's env spec; the episode store's schema is built from it."""
        from acce.store.episodes import EpisodeStore
        from acce.store.schema import StoreSchema

        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.store = EpisodeStore.open_or_create(self.out_dir / "episodes.zarr", **StoreSchema.fields_for(spec))
        self.log_path = self.out_dir / "episodes.jsonl"
        self.latency_path = self.out_dir / "latency.json"

    def append(self, episode: Episode, info: dict[str, Any]) -> int:
        """Commit the episode to the store, then its log line (a crash in between leaves the store authoritative)."""
        index = self.store.append(episode)
        events = info.pop("events", [])
        line = {"episode_index": index, "episode_id": episode.episode_id, "task": episode.task, "seed": episode.seed,
                "instruction": episode.instruction, "source": episode.source, "steps": episode.num_steps,
                "success": episode.is_success, **info, "events": events[:MAX_EVENTS_PER_EPISODE],
                "events_omitted": max(0, len(events) - MAX_EVENTS_PER_EPISODE)}
        with open(self.log_path, "a") as f:
            f.write(json.dumps(line, default=_json_default) + "\n")
        return index
