"""World-model training data: episodes from a zarr episode store or a LeRobotDataset v3 directory, split by episode,
sampled as fixed-length sequences (obs_t, a_t, reward_t, success_t, terminated_t, obs_{t+1}).

Everything is held in memory as uint8 frames (1,000 reach/push episodes at 64x64 are ~0.5 GB); a store is read with
one `frames()` call per array and episodes are views into those arrays, so loading costs one pass over the files.
A LeRobotDataset is read through lerobot's own LeRobotDataset class (acce.store.lerobot_import.import_lerobot) into a
temporary episode store first, so both formats go through the same validated reader.
"""
from __future__ import annotations

import os
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from acce.data_kind import data_kind
from acce.store.episodes import EpisodeStore
from acce.types import AUX_KEY, IMAGE_PREFIX, STATE_KEY, Episode


@dataclass
class EpisodeArrays:
    """One episode as the world model reads it (T transitions, T + 1 frames)."""

    images: np.ndarray
    """(T+1, H, W, 3C) uint8, cameras concatenated along channels in `cameras` order"""
    state: np.ndarray
    """(T+1, S) float32"""
    action: np.ndarray
    """(T, A) float32 executed actions"""
    reward: np.ndarray
    """(T,) float32"""
    terminated: np.ndarray
    """(T,) bool"""
    success: np.ndarray
    """(T,) bool"""
    instruction: str
    task: str
    task_id: int
    seed: int
    episode_id: str
    aux: np.ndarray | None = None
    """(T+1, P) float32 privileged labels (obs["aux"]) when the episode was recorded with them, else None"""

    @property
    def num_steps(self) -> int:
        return int(self.action.shape[0])


def _concat_cameras(obs: dict[str, np.ndarray], cameras: Sequence[str]) -> np.ndarray:
    keys = [f"{IMAGE_PREFIX}{c}" for c in cameras]
    missing = [k for k in keys if k not in obs]
    if missing:
        raise KeyError(f"episode has no {missing}; it has {sorted(k for k in obs if k.startswith(IMAGE_PREFIX))}")
    return obs[keys[0]] if len(keys) == 1 else np.concatenate([obs[k] for k in keys], -1)


def from_episode(ep: Episode, cameras: Sequence[str]) -> EpisodeArrays:
    return EpisodeArrays(images=_concat_cameras(ep.obs, cameras), state=np.asarray(ep.obs[STATE_KEY], np.float32),
                         action=np.asarray(ep.action, np.float32), reward=np.asarray(ep.reward, np.float32),
                         terminated=np.asarray(ep.terminated, bool), success=np.asarray(ep.success, bool),
                         instruction=ep.instruction, task=ep.task, task_id=int(ep.task_id), seed=int(ep.seed),
                         episode_id=ep.episode_id,
                         aux=np.asarray(ep.obs[AUX_KEY], np.float32) if AUX_KEY in ep.obs else None)


def split_cameras(images: np.ndarray, cameras: Sequence[str]) -> dict[str, np.ndarray]:
    """(..., H, W, 3C) -> {"image/<cam>": (..., H, W, 3)}"""
    return {f"{IMAGE_PREFIX}{c}": np.ascontiguousarray(images[..., 3 * i:3 * i + 3]) for i, c in enumerate(cameras)}


# --- reading datasets ---------------------------------------------------------------------------------------------
def _read_store(store: EpisodeStore) -> tuple[list[EpisodeArrays], dict[str, Any]]:
    """All committed episodes of a store, as views into arrays read once."""
    cams = sorted(store.schema.image_shapes)
    frames = {k: store.frames(k) for k in [*(f"{IMAGE_PREFIX}{c}" for c in cams), STATE_KEY, "action", "reward",
                                           "terminated", "success"] + ([AUX_KEY] if store.schema.aux_dim else [])}
    images = _concat_cameras(frames, cams)
    episodes = []
    for i in range(len(store)):
        start, stop = store.frame_range(i)
        t = stop - start - 1
        # The store has no public per-episode metadata reader that skips the frames (store[i] reads every array
        # again); its in-memory index holds exactly that.
        eps = {n: store._strings[n][i] for n in ("instruction", "task", "source", "episode_id")}
        episodes.append(EpisodeArrays(
            images=images[start:stop], state=frames[STATE_KEY][start:stop].astype(np.float32, copy=False),
            action=frames["action"][start:start + t], reward=frames["reward"][start:start + t],
            terminated=frames["terminated"][start:start + t], success=frames["success"][start:start + t],
            instruction=eps["instruction"], task=eps["task"], task_id=int(store._index["task_id"][i]),
            seed=int(store._index["seed"][i]), episode_id=eps["episode_id"],
            aux=frames[AUX_KEY][start:stop].astype(np.float32, copy=False) if AUX_KEY in frames else None))
    return episodes, {"cameras": cams, **store.meta, "summary": store.summary()}


def load_episodes(path: str | os.PathLike) -> tuple[list[EpisodeArrays], dict[str, Any]]:
    """Read every episode of a zarr episode store or a LeRobotDataset v3 directory.

    Returns (episodes, description) where description holds the path, kind ("zarr" / "lerobot"), cameras,
    image_shapes, state_dim, action_dim, control_hz and a per-task summary.
    """
    path = Path(path)
    kind = data_kind(path)
    if kind == "zarr":
        episodes, desc = _read_store(EpisodeStore.open(path))
    elif kind == "lerobot":
        from acce.store.lerobot_import import import_lerobot
        with tempfile.TemporaryDirectory(prefix="acce-wm-") as tmp:
            episodes, desc = _read_store(import_lerobot(path, Path(tmp) / "episodes.zarr"))
    else:
        raise FileNotFoundError(f"{path} is neither an acce episode store (no zarr.json) nor a LeRobotDataset v3 "
                                "directory (no meta/info.json); record one with `acce collect --out PATH`")
    if not episodes:
        raise ValueError(f"{path} holds no episodes; record some with `acce collect --out {path}`")
    return episodes, {"path": str(path), "kind": kind, **desc}


def split_by_episode(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic (train, validation) episode indices; validation gets at least one episode, train too."""
    if n < 2:
        raise ValueError(f"need at least 2 episodes to hold one out for validation, got {n}")
    order = np.random.default_rng(seed).permutation(n)
    n_val = min(max(1, int(round(n * val_fraction))), n - 1)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


# --- sampling sequences ---------------------------------------------------------------------------------------
class SequenceBuffer:
    """Episodes to sample training sequences from; keeps the most recent `capacity` episodes (None: all)."""

    def __init__(self, episodes: Iterable[EpisodeArrays] = (), capacity: int | None = None):
        self.episodes: deque[EpisodeArrays] = deque(maxlen=capacity)
        self.extend(episodes)

    def extend(self, episodes: Iterable[EpisodeArrays]) -> None:
        for ep in episodes:
            if ep.num_steps > 0:  # a zero-step episode has no transition to learn from
                self.episodes.append(ep)

    def __len__(self) -> int:
        return len(self.episodes)

    @property
    def num_transitions(self) -> int:
        return int(sum(ep.num_steps for ep in self.episodes))

    def sample(self, batch_size: int, seq_len: int, rng: np.random.Generator) -> dict[str, Any]:
        """Sequences of seq_len transitions (`windows`, stacked)."""
        return make_windows(self.windows(batch_size, seq_len, rng), seq_len)

    def windows(self, n: int, seq_len: int, rng: np.random.Generator) -> list[tuple[EpisodeArrays, int]]:
        """n (episode, start) windows: episodes drawn in proportion to their length (uniform over transitions), the
        start uniformly over the episode's steps, then clamped so the window fits: the end of an episode (success,
        termination) is seen as often as its middle."""
        if not self.episodes:
            raise RuntimeError("no episodes to sample from; add real episodes first")
        lengths = np.array([ep.num_steps for ep in self.episodes], np.float64)
        picks = rng.choice(len(lengths), size=n, p=lengths / lengths.sum())
        out = []
        for i in picks:
            t = int(lengths[i])
            out.append((self.episodes[i], min(int(rng.integers(t)), max(t - seq_len, 0))))
        return out


def make_windows(windows: Sequence[tuple[EpisodeArrays, int]], seq_len: int) -> dict[str, Any]:
    """Stack (episode, start) windows into padded arrays; `mask` (B, L) marks real transitions; "instruction" is
    the list of the windows' episode instructions; "aux" (B, L+1, P) only when every window's episode has labels."""
    B, L = len(windows), seq_len
    ep0 = windows[0][0]
    with_aux = all(ep.aux is not None for ep, _ in windows)
    out = {"images": np.zeros((B, L + 1, *ep0.images.shape[1:]), np.uint8),
           "state": np.zeros((B, L + 1, ep0.state.shape[1]), np.float32),
           "action": np.zeros((B, L, ep0.action.shape[1]), np.float32), "reward": np.zeros((B, L), np.float32),
           "terminated": np.zeros((B, L), bool), "success": np.zeros((B, L), bool), "mask": np.zeros((B, L), bool),
           "instruction": [ep.instruction for ep, _ in windows]}
    for b, (ep, t0) in enumerate(windows):
        n = min(L, ep.num_steps - t0)
        out["images"][b, :n + 1] = ep.images[t0:t0 + n + 1]
        out["state"][b, :n + 1] = ep.state[t0:t0 + n + 1]
        for key in ("action", "reward", "terminated", "success"):
            out[key][b, :n] = getattr(ep, key)[t0:t0 + n]
        out["mask"][b, :n] = True
    if with_aux:
        out["aux"] = np.zeros((B, L + 1, ep0.aux.shape[1]), np.float32)
        for b, (ep, t0) in enumerate(windows):
            out["aux"][b, :min(L, ep.num_steps - t0) + 1] = ep.aux[t0:t0 + L + 1]
    return out


def validation_windows(episodes: Sequence[EpisodeArrays], seq_len: int, max_windows: int = 64) -> list[dict]:
    """Fixed, non-overlapping windows over the validation episodes (deterministic validation loss), in batches."""
    windows = [(ep, t0) for ep in episodes for t0 in range(0, max(ep.num_steps, 1), seq_len) if ep.num_steps > 0]
    windows = windows[:max_windows]
    return [make_windows(windows[i:i + 16], seq_len) for i in range(0, len(windows), 16)]
