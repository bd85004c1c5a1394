"""WMConfig: the world model's schema (Config field `wm`). Plain dataclass, no torch, so `import worldmodel` is light.

Action conditioning is at the control-step level: `next(z, a)` advances one control step with the action that really
executed. Episodes and segments record executed actions per control step (after latency and safety), so a
control-step model trains on exactly what ran, and ImaginedEnv can be stepped by the same RolloutWorker that builds
chunks with committed prefixes and delays (DESIGN.md §5) — a chunk-level model would have to re-derive which
actions of a chunk really ran.
"""
from __future__ import annotations

from dataclasses import dataclass

from acce.configlib import ConfigError

ACTION_LEVELS = ("control_step",)
"""implemented action-conditioning levels (see the module docstring)"""


@dataclass(frozen=True)
class WMConfig:
    image_size: int = 64
    """square image resolution the model reads and writes (must equal env.image_size; a power of two >= 16)"""
    latent_dim: int = 128
    """size of the deterministic latent z (layer-normalized: one unit is one latent standard deviation)"""
    instruction_dim: int = 32
    """size of the instruction embedding appended to the latent; the reward, terminated and success heads read it
    (in reach, which cube counts is named only by the instruction); dynamics carry it unchanged"""
    instruction_buckets: int = 4096
    """hashed word vocabulary of the instruction embedding (bag of words; unseen words embed to zero)"""
    channels: int = 16
    """width of the first conv layer; doubles at every stride-2 layer down to 4x4 (capped at 8x)"""
    hidden_dim: int = 256
    """width of the MLPs: dynamics heads, reward head, termination/success head, state decoder"""
    ensemble_size: int = 5
    """K dynamics heads; their disagreement gates imagined rollouts (K >= 3 so a spread is meaningful)"""
    action_level: str = "control_step"
    """action conditioning: 'control_step' (next(z, a) advances one control step with the executed action)"""
    horizon: int = 16
    """imagined branches are truncated after this many control steps (long horizons drift)"""
    max_disagreement: float = 0.2
    """truncate an imagined branch when the ensemble disagreement of a step exceeds this (mean over latent dims of
    the heads' standard deviation, in latent units); `acce wm-eval` reports its quantiles on real held-out data
    (default model, 1,000 reach/push episodes, 3,000 steps: p99 = 0.10; an untrained model sits near 0.27, so a
    fresh online model is gated until it has learned something)"""
    start_buffer_episodes: int = 256
    """ImaginedEnv and the online trainer keep the most recent real episodes (start states / training data)"""
    lr: float = 1e-3
    """Adam learning rate"""
    batch_size: int = 16
    """sequences per optimizer step"""
    seq_len: int = 8
    """transitions per training sequence: latents are rolled out open loop through all of them"""
    rollout_discount: float = 0.9
    """weight of step t of the rolled-out losses is rollout_discount**t (later steps are harder; TD-MPC2's rho)"""
    image_weight: float = 1.0
    """loss weight of image reconstruction and prediction (MSE on [0, 1] pixels, summed over pixels / 1000)"""
    state_weight: float = 1.0
    """loss weight of state reconstruction and prediction (MSE on normalized state)"""
    latent_weight: float = 1.0
    """loss weight of latent consistency: each head's prediction vs the encoding of the real next observation"""
    reward_weight: float = 1.0
    """loss weight of the reward head (MSE on normalized reward)"""
    done_weight: float = 1.0
    """loss weight of the terminated and success heads (binary cross-entropy)"""
    max_grad_norm: float = 10.0
    """gradient norm clip"""
    val_fraction: float = 0.1
    """wm-pretrain: fraction of episodes held out for validation (split by episode, at least one)"""
    val_every: int = 100
    """wm-pretrain: validation loss and TensorBoard frames every this many steps"""
    seed: int = 0
    """network init, train/validation split and batch sampling"""

    def __post_init__(self) -> None:
        size = self.image_size
        if size < 16 or size & (size - 1):
            raise ConfigError(f"wm.image_size={size} must be a power of two >= 16 (e.g. 32 or 64); set it to "
                              "env.image_size")
        if self.ensemble_size < 3:
            raise ConfigError(f"wm.ensemble_size={self.ensemble_size}: use at least 3 heads so their disagreement "
                              "means something")
        if self.action_level not in ACTION_LEVELS:
            raise ConfigError(f"wm.action_level={self.action_level!r}: only {ACTION_LEVELS} is implemented (episodes "
                              "record executed actions per control step)")
        for name in ("latent_dim", "instruction_dim", "instruction_buckets", "channels", "hidden_dim", "horizon",
                     "batch_size", "seq_len", "val_every",
                     "start_buffer_episodes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"wm.{name} must be >= 1, got {getattr(self, name)}")
        if not self.max_disagreement > 0:
            raise ConfigError(f"wm.max_disagreement must be > 0, got {self.max_disagreement}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"wm.val_fraction must be in (0, 1), got {self.val_fraction}")
        if not 0.0 < self.rollout_discount <= 1.0:
            raise ConfigError(f"wm.rollout_discount must be in (0, 1], got {self.rollout_discount}")

    @property
    def num_down(self) -> int:
        """stride-2 conv layers from image_size down to 4x4"""
        return size_log2(self.image_size) - 2


def size_log2(size: int) -> int:
    return int(size).bit_length() - 1
