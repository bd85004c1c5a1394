"""WorldModelTrainer: the role that co-trains the world model online on real episodes and publishes versions.

A plain class (docs/design.md §1): the runtime places it in a Ray actor or a thread and moves episodes in and
(version, state) out; it knows nothing about queues or actors. `wm-pretrain` drives the same class offline, so
online and offline training share one optimizer step. The version is the number of optimizer steps the weights
have seen (pretraining included), like `learner_version`.

Only real experience trains the model: episodes with source "imagined" are refused and counted, because a model
trained on its own imagination reinforces its own errors.

A model with an aux head (aux_dim > 0, for the privileged critic) trains it on the episodes' privileged labels
(obs["aux"]); an episode without them is an error, never zeros a head would learn to predict.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from acce.types import Episode
from worldmodel.config import WMConfig
from worldmodel.data import EpisodeArrays, SequenceBuffer, from_episode, make_windows
from worldmodel.losses import sequence_loss, to_tensors
from worldmodel.model import WorldModel


class WorldModelTrainer:
    def __init__(self, model: WorldModel, *, capacity_episodes: int | None = None, seed: int | None = None,
                 device: str = "cpu"):
        self.model = model.to(device).train()
        self.cfg: WMConfig = model.cfg
        self.device = device
        self.buffer = SequenceBuffer(capacity=capacity_episodes if capacity_episodes is not None
                                     else self.cfg.start_buffer_episodes)
        self.rng = np.random.default_rng(self.cfg.seed if seed is None else seed)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=self.cfg.lr)
        self.replay: SequenceBuffer | None = None
        """episodes replayed beside the buffer's (the pretraining data, `set_replay`); never evicted"""
        self.replay_fraction = 0.0
        self.calibrator = None
        """the done heads' online thresholds (`set_calibration`; None: logit > 0, or what a checkpoint holds)"""
        self.skipped_imagined = 0
        """episodes refused because they came from imagination"""
        self.episodes_added = 0

    @classmethod
    def create(cls, cfg: WMConfig, *, state_dim: int, action_dim: int, control_hz: float,
               cameras: Sequence[str] = ("front",), aux_dim: int = 0, **kw: Any) -> WorldModelTrainer:
        """A fresh model initialized from cfg.seed (normalization is fitted from the first episodes added);
        aux_dim > 0 gives it an aux head trained on the episodes' obs["aux"]."""
        with torch.random.fork_rng():  # seeded init without moving the caller's global RNG
            torch.manual_seed(cfg.seed)
            model = WorldModel(cfg, state_dim=state_dim, action_dim=action_dim, cameras=tuple(cameras),
                               control_hz=control_hz, aux_dim=aux_dim)
        return cls(model, **kw)

    @classmethod
    def from_checkpoint(cls, path: str, **kw: Any) -> WorldModelTrainer:
        """Continue from a pretrained checkpoint (its version counts on)."""
        return cls(WorldModel.load(path), **kw)

    @property
    def version(self) -> int:
        return int(self.model.version)

    # --- data -----------------------------------------------------------------------------------------------------
    def add_episodes(self, episodes: Iterable[Episode]) -> int:
        """Add finished real episodes (sim, real, demo); returns how many were kept."""
        kept = [from_episode(ep, self.model.cameras) for ep in episodes if self._keep(ep)]
        self.add_arrays(kept)
        return len(kept)

    def _keep(self, ep: Episode) -> bool:
        if ep.source == "imagined":
            self.skipped_imagined += 1
            return False
        return True

    def add_arrays(self, episodes: Sequence[EpisodeArrays]) -> None:
        p = self.model.aux_dim
        self._check_episodes(episodes, "episode(s)")
        if self.calibrator is not None and bool(self.model.stats_ready):  # scored before the model trains on them
            self.calibrator.observe(self.model, episodes)
        self.buffer.extend(episodes)
        self.episodes_added += len(episodes)
        if not bool(self.model.stats_ready) and len(self.buffer):
            # Fixed once: moving statistics would silently change what every latent means.
            eps = list(self.buffer.episodes)
            self.model.fit_normalization(np.concatenate([e.state for e in eps]),
                                         np.concatenate([e.reward for e in eps]),
                                         np.concatenate([e.aux for e in eps]) if p else None)

    def set_replay(self, episodes: Sequence[EpisodeArrays], fraction: float) -> int:
        """Draw round(fraction x batch_size) of every batch's sequences from `episodes` (e.g. the data the model was
        pretrained on) and the rest from the buffer's recent episodes: fine-tuning on a few dozen episodes of one
        policy then cannot erase what the model learned from the wider data. Returns the replayed episode count."""
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"replay fraction must be in [0, 1), got {fraction}")
        self._check_episodes(episodes, "replay data")
        shapes = {ep.images.shape[1:] for ep in episodes} | {ep.state.shape[1:] for ep in episodes}
        want = {(self.cfg.image_size, self.cfg.image_size, 3 * len(self.model.cameras)), (self.model.state_dim,)}
        if shapes - want:
            raise ValueError(f"replay data has images/state of shapes {sorted(shapes - want)} but the world model "
                             f"reads {sorted(want)} (cameras {list(self.model.cameras)}); replay data recorded "
                             "with this model's cameras, image size and state")
        replay = SequenceBuffer(episodes)
        if not len(replay):
            raise ValueError("replay data holds no episode with a transition")
        self.replay, self.replay_fraction = replay, float(fraction)
        return len(replay)

    def set_calibration(self, frames: int, rule: str = "f1") -> None:
        """Fit the terminated / success thresholds ImaginedEnv acts on to the last `frames` real transitions, each
        scored before its episode joins the buffer (worldmodel.calibration, `rule` f1 or count); they travel with
        published weights."""
        from worldmodel.calibration import Calibrator
        self.calibrator = Calibrator(frames, rule)

    def _sample(self) -> dict[str, Any]:
        B, L = self.cfg.batch_size, self.cfg.seq_len
        k = min(int(round(self.replay_fraction * B)), B - 1) if self.replay is not None else 0  # >= 1 recent
        windows = self.replay.windows(k, L, self.rng) if k else []
        return make_windows(windows + self.buffer.windows(B - k, L, self.rng), L)

    def _check_episodes(self, episodes: Sequence[EpisodeArrays], what: str) -> None:
        p = self.model.aux_dim
        bad = [ep.episode_id for ep in episodes if p and (ep.aux is None or ep.aux.shape[1:] != (p,))]
        if bad:
            raise ValueError(f"the world model has an aux head (aux_dim={p}) but {len(bad)} {what} (e.g. "
                             f"{bad[0]}) have no obs['aux'] of width {p}; record them from envs with aux labels "
                             "(policy.critic=privileged turns them on) or use a model without an aux head")

    # --- optimization ---------------------------------------------------------------------------------------------
    def train_steps(self, n: int) -> dict[str, float]:
        """n optimizer steps on sequences from the buffer (and the replay data, `set_replay`); returns the mean of
        each loss as wm/* metrics."""
        if not len(self.buffer):
            raise RuntimeError("WorldModelTrainer has no episodes; call add_episodes() with real episodes first")
        self.model.train()
        sums: dict[str, float] = {}
        t0 = time.perf_counter()
        for _ in range(n):
            batch = to_tensors(self._sample(), self.device)
            loss, parts = sequence_loss(self.model, batch)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
            self.optimizer.step()
            self.model.version += 1
            parts["grad_norm"] = float(grad_norm)
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + v
        elapsed = time.perf_counter() - t0
        out = {f"wm/loss/{k}": v / max(n, 1) for k, v in sums.items() if k not in ("disagreement", "grad_norm")}
        out.update({"wm/disagreement/train": sums.get("disagreement", 0.0) / max(n, 1),
                    "wm/grad_norm": sums.get("grad_norm", 0.0) / max(n, 1), "wm/version": float(self.version),
                    "wm/train_sps": n / elapsed if elapsed > 0 else 0.0,
                    "wm/buffer_episodes": float(len(self.buffer)),
                    "wm/replay_episodes": float(len(self.replay) if self.replay is not None else 0),
                    "wm/skipped_imagined_episodes": float(self.skipped_imagined)})
        if self.calibrator is not None:
            out.update({"wm/threshold/terminated": float(self.model.done_threshold[0]),
                        "wm/threshold/success": float(self.model.done_threshold[1]),
                        "wm/calibration_frames": float(self.calibrator.window_frames)})
        return out

    @torch.no_grad()
    def evaluate(self, batches: Sequence[dict[str, np.ndarray]]) -> dict[str, float]:
        """Mean loss parts over fixed batches (validation), without updating anything."""
        self.model.eval()
        sums: dict[str, float] = {}
        for b in batches:
            _, parts = sequence_loss(self.model, to_tensors(b, self.device))
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + v / len(batches)
        self.model.train()
        return sums

    # --- publishing -----------------------------------------------------------------------------------------------
    def publish(self) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, state_dict on CPU, detached copies): what ImaginedEnv.load_weights takes. The normalization
        statistics are buffers, so they travel with the weights."""
        return self.version, {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def save(self, path: str) -> None:
        self.model.save(path)
