"""WorldModel: encode -> next -> decode, with reward, terminated and success heads (docs/design.md §7, TD-MPC2 verbs).

    z  = encode(obs)                  obs: {"image/<cam>": (B, H, W, 3) uint8, "state": (B, S), "instruction": [B]}
                                      -> (B, L + G)
    p  = next(z, a)                   a: (B, A) in [-1, 1] -> p.z (B, L + G) mean of K heads, p.heads (K, B, L + G),
                                      p.disagreement (B,) mean over physical latent dims of the heads' std
    o  = decode(z, context)           -> {"image/<cam>": (B, H, W, 3) uint8, "state": (B, S) float32} (numpy);
                                      context = the real frame a branch started from (unchanged pixels are copied)
    r  = reward(z, a)                 -> (B,) reward of the transition that starts at z with action a
    terminated(z), success(z)         -> (B,) logits for the state z (the state *after* a transition)
    x  = aux(z)                       -> (B, P) float32 privileged labels (object/goal xy) of the state z; only a
                                      model built with aux_dim = P > 0 has this head

A latent is [physical part (L = wm.latent_dim) | instruction embedding (G = wm.instruction_dim)]. The physical part
is deterministic and layer-normalized (no affine), so its scale is fixed and `wm.max_disagreement` is in latent
standard deviations; each dynamics head predicts a residual on it, z' = LN(z + f_k(z, a)), and carries the
instruction part unchanged (physics does not depend on the instruction; the reward does: in reach only the
instruction names the cube to touch). The instruction embedding is a hashed bag of words (TD-MPC2 uses a learned
task embedding; words generalize to paraphrases that reuse them, and unseen words embed to zero).
The reward and success heads ship and version with the model (RLinf #795: users could not reproduce world-model RL
without them). Normalization statistics (state and reward mean/std) are buffers, so they travel in every state
dict and checkpoint; using the model before they are set is an error.
The optional aux head (aux_dim > 0) exists for the privileged critic (policy.critic=privileged), which reads the
sim's labels obs["aux"]: ImaginedEnv emits the head's predictions there so imagined states are valued like real ones.
It reads the instruction part too (the labels are the positions of the object and goal the instruction names).
"""
from __future__ import annotations

import dataclasses
import os
import re
import zlib
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
import torch
from torch import nn

from acce.types import AUX_KEY, IMAGE_PREFIX, INSTRUCTION_KEY, STATE_KEY
from worldmodel.config import WMConfig
from worldmodel.nets import ConvDecoder, ConvEncoder, EnsembleMLP, mlp

FORMAT = "acce-worldmodel"
FORMAT_VERSION = 1


def _as_tensor(x: Any, device: torch.device) -> torch.Tensor:
    """x as a tensor on device; a read-only array (zarr chunks, shared-memory episodes) is copied first, since torch
    cannot wrap it without warning, and the caller converts to float, which copies anyway."""
    if torch.is_tensor(x):
        return x.to(device)
    arr = np.asarray(x)
    return torch.as_tensor(arr if arr.flags.writeable else arr.copy(), device=device)


class Prediction(NamedTuple):
    z: torch.Tensor
    """(B, L + G) mean of the heads' next latents (what imagination follows)"""
    heads: torch.Tensor
    """(K, B, L + G) each head's next latent (the instruction part is the same in all)"""
    disagreement: torch.Tensor
    """(B,) mean over the physical latent dims of the std across heads"""


class WorldModel(nn.Module):
    def __init__(self, cfg: WMConfig, *, state_dim: int, action_dim: int, control_hz: float,
                 cameras: tuple[str, ...] = ("front",), aux_dim: int = 0):
        """control_hz: the rate of the episodes it learns from (their env spec's); imagined episodes run at it.
        aux_dim: P of the privileged aux labels the aux head predicts (0: no head; checkpoints without it load so)."""
        super().__init__()
        if aux_dim < 0:
            raise ValueError(f"aux_dim must be >= 0 (0 = no aux head), got {aux_dim}")
        self.cfg, self.state_dim, self.action_dim = cfg, int(state_dim), int(action_dim)
        self.aux_dim = int(aux_dim)
        self.cameras, self.control_hz = tuple(cameras), float(control_hz)
        self.version = 0
        """world-model optimizer steps that produced these weights (the wm_version they publish as)"""
        self.data_info: dict[str, Any] = {}
        """what the model was trained on (path, episodes, tasks, split); saved in the checkpoint"""
        L, G, H = cfg.latent_dim, cfg.instruction_dim, cfg.hidden_dim
        S, A, C = self.state_dim, self.action_dim, 3 * len(self.cameras)
        self.image_encoder = ConvEncoder(C, cfg.channels, cfg.num_down)
        self.fuse = mlp([self.image_encoder.out_dim + S, H, L])
        self.instruction_embedding = nn.EmbeddingBag(cfg.instruction_buckets, G, mode="mean")
        nn.init.zeros_(self.instruction_embedding.weight)  # words never seen in training stay neutral
        self.dynamics = EnsembleMLP(cfg.ensemble_size, [L + A, H, H, L])
        self.image_decoder = ConvDecoder(L, len(self.cameras), self.image_encoder.widths)
        self.state_decoder = mlp([L, H, S])
        self.reward_head = mlp([L + G + A, H, 1])
        self.done_head = mlp([L + G, H, 2])  # logits: (terminated, success)
        self.register_buffer("state_mean", torch.zeros(S))
        self.register_buffer("state_std", torch.ones(S))
        self.register_buffer("reward_mean", torch.zeros(()))
        self.register_buffer("reward_std", torch.ones(()))
        self.register_buffer("stats_ready", torch.zeros((), dtype=torch.bool))
        # (terminated, success) logit thresholds ImaginedEnv acts on; wm.calibrate_frames fits them online
        self.register_buffer("done_threshold", torch.zeros(2))
        if self.aux_dim:  # registered only with the head, so state dicts of models without one are unchanged
            self.aux_head = mlp([L + G, H, self.aux_dim])
            self.register_buffer("aux_mean", torch.zeros(self.aux_dim))
            self.register_buffer("aux_std", torch.ones(self.aux_dim))

    # --- normalization --------------------------------------------------------------------------------------------
    @property
    def _stat_names(self) -> tuple[str, ...]:
        return ("state_mean", "state_std", "reward_mean", "reward_std") + (("aux_mean", "aux_std") if self.aux_dim
                                                                             else ())

    def fit_normalization(self, states: np.ndarray, rewards: np.ndarray, aux: np.ndarray | None = None) -> None:
        """Set state/reward (and aux, (N', P), for a model with an aux head) statistics from data: states (N, S),
        rewards (N,). Std is floored so constant dimensions (a gripper that never moves) do not blow up."""
        states, rewards = np.asarray(states, np.float64), np.asarray(rewards, np.float64)
        if states.ndim != 2 or states.shape[1] != self.state_dim or len(states) == 0 or len(rewards) == 0:
            raise ValueError(f"fit_normalization needs states (N, {self.state_dim}) and rewards (N,) with N > 0, "
                             f"got {states.shape} and {rewards.shape}")
        stats = {"state_mean": states.mean(0), "state_std": np.maximum(states.std(0), 1e-3),
                 "reward_mean": rewards.mean(), "reward_std": max(float(rewards.std()), 1e-3)}
        if self.aux_dim:
            aux = None if aux is None else np.asarray(aux, np.float64)
            if aux is None or aux.ndim != 2 or aux.shape[1] != self.aux_dim or len(aux) == 0:
                raise ValueError(f"this world model has an aux head: fit_normalization needs aux labels (N, "
                                 f"{self.aux_dim}), got {None if aux is None else aux.shape}")
            stats.update(aux_mean=aux.mean(0), aux_std=np.maximum(aux.std(0), 1e-3))
        self.set_normalization(stats)

    def set_normalization(self, stats: Mapping[str, Any]) -> None:
        missing = set(self._stat_names) - set(stats)
        if missing:
            raise ValueError(f"normalization stats lack {sorted(missing)}")
        for name in self._stat_names:
            buf = getattr(self, name)
            value = torch.as_tensor(np.asarray(stats[name], np.float32))
            if value.shape != buf.shape or not torch.isfinite(value).all():
                raise ValueError(f"normalization {name} must be finite with shape {tuple(buf.shape)}, got {value}")
            buf.copy_(value)
        self.stats_ready.fill_(True)

    def normalization(self) -> dict[str, Any]:
        return {n: getattr(self, n).tolist() for n in self._stat_names}

    def require_stats(self) -> None:
        if not bool(self.stats_ready):
            raise RuntimeError("world model has no normalization statistics; call fit_normalization(states, rewards) "
                               "on training data or load a checkpoint (wm-pretrain writes them)")

    # --- observation <-> tensors ----------------------------------------------------------------------------------
    @property
    def image_keys(self) -> list[str]:
        return [f"{IMAGE_PREFIX}{c}" for c in self.cameras]

    def obs_tensors(self, obs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy-format batch -> (pixels (B, 3C, S, S) in [0, 1], normalized state (B, S))."""
        self.require_stats()
        dev = self.state_mean.device
        missing = [k for k in [*self.image_keys, STATE_KEY] if k not in obs]
        if missing:
            raise KeyError(f"observation lacks {missing}; the world model reads {[*self.image_keys, STATE_KEY]}")
        images = []
        for key in self.image_keys:
            img = _as_tensor(obs[key], dev)
            if img.shape[-3:] != (self.cfg.image_size, self.cfg.image_size, 3):
                raise ValueError(f"obs[{key!r}] has shape {tuple(img.shape)}; the model reads (B, "
                                 f"{self.cfg.image_size}, {self.cfg.image_size}, 3) (wm.image_size)")
            images.append(img.permute(0, 3, 1, 2).contiguous().float() / 255.0)
        state = _as_tensor(obs[STATE_KEY], dev).float()
        return torch.cat(images, 1), (state - self.state_mean) / self.state_std

    # --- the verbs ------------------------------------------------------------------------------------------------
    @property
    def z_dim(self) -> int:
        return self.cfg.latent_dim + self.cfg.instruction_dim

    def embed_instruction(self, instructions: Sequence[str]) -> torch.Tensor:
        """(B, G) mean of hashed word embeddings (crc32, so the hash is the same in every process)."""
        ids, offsets = [], []
        for text in instructions:
            offsets.append(len(ids))
            ids += [zlib.crc32(w.encode()) % self.cfg.instruction_buckets for w in re.findall(r"[a-z0-9]+",
                                                                                             str(text).lower())]
        dev = self.state_mean.device
        return self.instruction_embedding(torch.tensor(ids, dtype=torch.long, device=dev),
                                          torch.tensor(offsets, dtype=torch.long, device=dev))

    def encode_tensors(self, pixels: torch.Tensor, state_n: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
        """pixels (B, 3C, S, S), normalized state (B, S), instruction embedding (B, G) -> z (B, L + G)"""
        h = torch.cat([self.image_encoder(pixels), state_n], -1)
        return torch.cat([nn.functional.layer_norm(self.fuse(h), (self.cfg.latent_dim,)), goal], -1)

    def encode(self, obs: Mapping[str, Any]) -> torch.Tensor:
        """(B, L + G) latent of a policy-format observation batch (images, state and instruction)."""
        if INSTRUCTION_KEY not in obs:
            raise KeyError("observation lacks 'instruction'; the reward and success heads are conditioned on it")
        return self.encode_tensors(*self.obs_tensors(obs), self.embed_instruction(obs[INSTRUCTION_KEY]))

    def next(self, z: torch.Tensor, action: torch.Tensor | np.ndarray) -> Prediction:
        """One control step of every dynamics head from latent z with the executed action."""
        L = self.cfg.latent_dim
        phys, goal = z[..., :L], z[..., L:]
        a = torch.as_tensor(action, dtype=z.dtype, device=z.device)
        heads = nn.functional.layer_norm(phys.unsqueeze(0) + self.dynamics(torch.cat([phys, a], -1)), (L,))
        mean = torch.cat([heads.mean(0), goal], -1)
        full = torch.cat([heads, goal.unsqueeze(0).expand(heads.shape[0], *goal.shape)], -1)
        return Prediction(mean, full, heads.std(0, unbiased=False).mean(-1))

    def decode_tensors(self, z: torch.Tensor, context: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixels (B, 3C, S, S) in [0, 1], normalized state (B, S)) from the physical part; differentiable.
        context: (B, 3C, S, S) start frame of the branch to composite onto (None: generate every pixel)."""
        phys = z[..., :self.cfg.latent_dim]
        return self.image_decoder(phys, context), self.state_decoder(phys)

    @torch.no_grad()
    def decode(self, z: torch.Tensor, context: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Policy-format observation batch (instruction is the env's to add), with "aux" (B, P) float32 when the
        model has an aux head. context: the images of the real frame the imagined branch started from (policy
        format); unchanged pixels are copied from it."""
        self.require_stats()
        ctx = None
        if context is not None:
            ctx = torch.cat([_as_tensor(context[k], z.device).permute(0, 3, 1, 2).contiguous().float() / 255.0
                             for k in self.image_keys], 1)
        pixels, state_n = self.decode_tensors(z, ctx)
        images = (pixels * 255.0).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        obs = {key: np.ascontiguousarray(images[..., 3 * i:3 * i + 3]) for i, key in enumerate(self.image_keys)}
        obs[STATE_KEY] = (state_n * self.state_std + self.state_mean).cpu().numpy().astype(np.float32)
        if self.aux_dim:
            obs[AUX_KEY] = self.aux(z).cpu().numpy().astype(np.float32)
        return obs

    def reward(self, z: torch.Tensor, action: torch.Tensor | np.ndarray, normalized: bool = False) -> torch.Tensor:
        """(B,) reward of the transition from z with `action` (normalized units for the loss)."""
        a = torch.as_tensor(action, dtype=z.dtype, device=z.device)
        r = self.reward_head(torch.cat([z, a], -1)).squeeze(-1)
        return r if normalized else r * self.reward_std + self.reward_mean

    def aux(self, z: torch.Tensor, normalized: bool = False) -> torch.Tensor:
        """(B, P) privileged labels of the state z (standardized units for the loss); needs aux_dim > 0."""
        if not self.aux_dim:
            raise RuntimeError("this world model has no aux head (aux_dim=0); train one on episodes with aux labels")
        x = self.aux_head(z)
        return x if normalized else x * self.aux_std + self.aux_mean

    def done_logits(self, z: torch.Tensor) -> torch.Tensor:
        """(B, 2) logits (terminated, success) of the state z."""
        return self.done_head(z)

    def done_flags(self, z: torch.Tensor) -> torch.Tensor:
        """(B, 2) bool (terminated, success) of the state z: each logit above its head's threshold."""
        return self.done_logits(z) > self.done_threshold

    def terminated(self, z: torch.Tensor) -> torch.Tensor:
        return self.done_logits(z)[..., 0]

    def success(self, z: torch.Tensor) -> torch.Tensor:
        return self.done_logits(z)[..., 1]

    # --- checkpoints ----------------------------------------------------------------------------------------------
    def num_parameters(self) -> dict[str, int]:
        heads = [self.reward_head, self.done_head] + ([self.aux_head] if self.aux_dim else [])
        parts = {"encoder": [self.image_encoder, self.fuse, self.instruction_embedding], "dynamics": [self.dynamics],
                 "decoder": [self.image_decoder, self.state_decoder], "heads": heads}
        out = {k: sum(p.numel() for m in ms for p in m.parameters()) for k, ms in parts.items()}
        out["total"] = sum(out.values())
        return out

    def describe(self) -> dict[str, Any]:
        """Everything needed to rebuild the model (besides weights)."""
        return {"config": dataclasses.asdict(self.cfg), "state_dim": self.state_dim, "action_dim": self.action_dim,
                "cameras": list(self.cameras), "control_hz": self.control_hz, "aux_dim": self.aux_dim}

    def save(self, path: str | os.PathLike) -> Path:
        """Write a self-describing checkpoint atomically (temp file, then rename)."""
        self.require_stats()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"format": FORMAT, "format_version": FORMAT_VERSION, "wm_version": int(self.version),
                   **self.describe(), "normalization": self.normalization(), "data": self.data_info,
                   "state_dict": {k: v.detach().cpu().clone() for k, v in self.state_dict().items()}}
        tmp = path.with_name(path.name + ".tmp")
        torch.save(payload, tmp)
        tmp.replace(path)
        return path

    @classmethod
    def from_description(cls, desc: Mapping[str, Any]) -> WorldModel:
        known = {f.name for f in dataclasses.fields(WMConfig)}
        unknown = sorted(set(desc["config"]) - known)
        if unknown:
            raise ValueError(f"world-model config has unknown field(s) {unknown}; it was written by a newer acce")
        cfg = WMConfig(**desc["config"])
        return cls(cfg, state_dim=desc["state_dim"], action_dim=desc["action_dim"], cameras=tuple(desc["cameras"]),
                   control_hz=desc["control_hz"], aux_dim=int(desc.get("aux_dim", 0)))

    @classmethod
    def from_state(cls, desc: Mapping[str, Any], version: int, state: Mapping[str, torch.Tensor]) -> WorldModel:
        """Rebuild a published model in another process: `describe()` + `WorldModelTrainer.publish()`."""
        model = cls.from_description(desc)
        model.load_state_dict(dict(state))
        model.require_stats()  # the statistics are buffers in `state`
        model.version = int(version)
        return model.eval()

    @classmethod
    def load(cls, path: str | os.PathLike, map_location: str = "cpu") -> WorldModel:
        """Rebuild a model from `save`'s file; every problem is one error that names the file."""
        path = Path(path)
        if path.is_dir():
            path = path / "worldmodel.pt"
        if not path.is_file():
            raise FileNotFoundError(f"no world-model checkpoint at {path}; `acce wm-pretrain --out DIR` writes "
                                    "DIR/worldmodel.pt")
        try:
            payload = torch.load(path, map_location=map_location, weights_only=True)
        except Exception as err:  # torch raises many types for a truncated / foreign file
            raise ValueError(f"{path} is not a readable world-model checkpoint ({type(err).__name__}: {err})") from None
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise ValueError(f"{path} is not an acce world-model checkpoint (format != {FORMAT!r})")
        if payload.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{path} has format_version={payload.get('format_version')!r}; this acce reads "
                             f"{FORMAT_VERSION}")
        missing = [k for k in ("config", "state_dim", "action_dim", "cameras", "control_hz", "normalization",
                               "state_dict", "wm_version") if k not in payload]
        if missing:
            raise ValueError(f"{path} lacks {missing}; re-run wm-pretrain (normalization stats are required)")
        model = cls.from_description(payload)
        state = {"done_threshold": torch.zeros(2), **payload["state_dict"]}  # checkpoints from before thresholds
        try:
            model.load_state_dict(state)
        except RuntimeError as err:
            raise ValueError(f"{path}: weights do not fit the described model: {str(err).splitlines()[0]}") from None
        model.set_normalization(payload["normalization"])
        model.version, model.data_info = int(payload["wm_version"]), dict(payload.get("data") or {})
        return model.eval()
