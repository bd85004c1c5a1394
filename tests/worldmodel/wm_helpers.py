"""Shared builders for the world-model tests: a tiny 32x32 model, synthetic episodes, a small real sim dataset."""
from __future__ import annotations

import uuid

import numpy as np
import torch

from acce.types import Episode
from worldmodel.config import WMConfig
from worldmodel.model import WorldModel

TINY = dict(image_size=32, latent_dim=32, instruction_dim=8, instruction_buckets=256, channels=8, hidden_dim=64,
            ensemble_size=3, batch_size=8, seq_len=4, horizon=6, val_every=10, start_buffer_episodes=16)
"""a model that trains at tens of steps per second on one CPU core"""


def tiny_cfg(**overrides) -> WMConfig:
    return WMConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, **overrides) -> WorldModel:
    torch.manual_seed(seed)
    model = WorldModel(tiny_cfg(**overrides), state_dim=7, action_dim=4, control_hz=10.0)
    rng = np.random.default_rng(seed)
    model.fit_normalization(rng.normal(size=(64, 7)), rng.normal(size=64))
    return model.eval()


def fake_episode(steps: int, seed: int, *, task_id: int = 0, source: str = "sim", size: int = 32) -> Episode:
    """Random frames and actions with the Episode contract (T transitions, T + 1 frames); success at the end."""
    rng = np.random.default_rng(seed)
    success = np.zeros(steps, bool)
    success[-1] = True
    return Episode(obs={"image/front": rng.integers(0, 256, (steps + 1, size, size, 3), dtype=np.uint8),
                        "state": rng.normal(size=(steps + 1, 7)).astype(np.float32)},
                   action=rng.uniform(-1, 1, (steps, 4)).astype(np.float32),
                   reward=rng.normal(size=steps).astype(np.float32), terminated=success.copy(),
                   truncated=np.zeros(steps, bool), success=success, behavior_version=np.full(steps, -1),
                   delay_steps=np.zeros(steps, np.int32), policy_sampled=np.ones(steps, bool),
                   timestamp_s=np.arange(steps + 1, dtype=np.float64), instruction=f"task {task_id} seed {seed}",
                   task="reach", task_id=task_id, source=source, seed=seed, episode_id=uuid.uuid4().hex)


def collect_reach_store(path, episodes: int = 16, seed: int = 0):
    """A small real dataset: scripted reach experts (half with action noise) at 32x32, via `acce collect`'s code."""
    from acce.collect import collect
    from acce.config import CollectConfig
    from acce.store.episodes import EpisodeStore
    from acce.wiring import make_sim_env

    store = EpisodeStore.create(path, image_shapes={"front": (32, 32)}, state_dim=7, action_dim=4, control_hz=10.0)
    cfg = CollectConfig(tasks=("reach",), episodes=episodes, noise_std=0.5, noisy_fraction=0.5, num_envs=4)
    collect(cfg, lambda tasks, n, **kw: make_sim_env(tasks, n, image_size=32, **kw), store, seed=seed,
            progress=False)
    return store


class CountingPolicy:
    """Zero chunks with fixed log-probs; counts rows (the InferenceServer's reply format)."""

    def __init__(self, chunk_len: int = 4, version: int = 0):
        self.chunk_len, self.version, self.rows = chunk_len, version, 0

    def infer(self, batch):
        n = len(batch["instruction"])
        self.rows += n
        return {"chunk": np.zeros((n, self.chunk_len, 4), np.float32),
                "logp_pos": np.full((n, self.chunk_len), -1.0, np.float32),
                "value": np.zeros(n, np.float32), "version": self.version}
