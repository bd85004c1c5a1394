"""WMConfig: the world model's schema (Config field `wm`). Plain dataclass, no torch, so `import worldmodel` is light.

Action conditioning is at the control-step level: `next(z, a)` advances one control step with the action that really
executed. Episodes and segments record executed actions per control step (after latency and safety), so a
control-step model trains on exactly what ran, and ImaginedEnv can be stepped by the same RolloutWorker that builds
chunks with committed prefixes and delays (docs/design.md §5) — a chunk-level model would have to re-derive which
actions of a chunk really ran.
"""
from __future__ import annotations

from dataclasses import dataclass

from acce.configlib import ConfigError

ACTION_LEVELS = ("control_step",)
"""implemented action-conditioning levels (see the module docstring)"""

CALIBRATE_RULES = ("f1", "count")
"""how the done-head thresholds are fitted (imagination.wm_calibrate_rule; worldmodel.calibration): the best F1, or
as many calls as positives"""


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
    aux_weight: float = 1.0
    """loss weight of the aux head (MSE on standardized privileged labels, obs["aux"]: the instruction's object and
    goal xy), on the encoded first frame and the rolled-out latents; used only by a model built with aux_dim > 0.
    ImaginedEnv emits its predictions as obs["aux"] so a privileged critic (policy.critic=privileged) can value
    imagined states"""
    done_pos_weight: float = 6.0
    """weight of a positive label (terminated / success) in those heads' cross-entropy (1 = unweighted). Positives
    are rare (one frame per successful episode, ~7 % of reach/push frames), so an unweighted head learns to say "no"
    and imagined episodes rarely succeed: success recall 0.00 / 0.30 unweighted, 0.52 / 0.52 at 6 with precision
    0.45 / 0.50 (two seeds, 800 steps, docs/decisions.md "World-model success head")"""
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
        if not self.done_pos_weight > 0:
            raise ConfigError(f"wm.done_pos_weight must be > 0 (1 = unweighted), got {self.done_pos_weight}")
        if not self.aux_weight >= 0:
            raise ConfigError(f"wm.aux_weight must be >= 0, got {self.aux_weight}")
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


@dataclass(frozen=True)
class ImaginationConfig:
    """The asynchronous imagination pipeline (Config field `imagination`; docs/design.md §7). Off by default."""

    num_workers: int = 0
    """imagination workers: RolloutWorkers whose env is an ImaginedEnv, sharing the sim workers' inference server
    (0: no imagination, the learner trains on simulator segments only)"""
    num_envs: int = 8
    """imagined branches stepped together by each imagination worker"""
    imagined_fraction: float = 0.0
    """share of each learner batch drawn from imagined segments: round(fraction x learner.batch_segments) per batch.
    The learner never waits for imagination: a share the imagined queue cannot fill is taken from the simulator and
    counted in queue/imagined_shortfall"""
    queue_capacity: int = 16
    """imagined segments waiting for the learner; imagination workers block when full (pacing, not dropping)"""
    record_fraction: float = 1.0
    """fraction of each sim worker's env slots whose episodes are recorded for the world model (rendered at every
    control step, ~6x the cost of a physics-only step at 32-64 px, measured; the others render at decisions only)"""
    episode_queue_capacity: int = 64
    """recorded real episodes waiting for the world-model trainer; when full the newest are dropped and counted
    (wm/dropped_real_episodes): a sim worker never waits for the world model"""
    wm_init_from: str = ""
    """start the world model from this `acce wm-pretrain` checkpoint (file or folder) instead of a fresh model;
    its architecture replaces wm.* model fields, the run's wm.horizon and wm.max_disagreement still gate"""
    wm_replay_from: str = ""
    """an episode store (zarr or LeRobotDataset v3 folder; typically the pretraining data of wm_init_from) the
    online trainer keeps replaying beside the run's own recent episodes, so that fine-tuning on a few dozen of them
    does not erase what the pretrained model knew (empty: train on the run's episodes only)"""
    wm_replay_fraction: float = 0.5
    """share of each world-model batch's sequences drawn from wm_replay_from when it is set (0: no replay)"""
    wm_calibrate_frames: int = 0
    """fit the world model's terminated / success thresholds online on the last this many real transitions, each
    scored before the model trains on it, to the logit with the best F1 (0: logit > 0, or a checkpoint's own).
    A fine-tuned head keeps its ranking but its logits drift, and imagined episodes then rarely succeed"""
    wm_calibrate_rule: str = "f1"
    """how the thresholds are fitted: `f1` (the cut with the best F1) or `count` (the cut above which the window
    holds as many logits as successes, so imagined episodes succeed about as often as real ones; a quantile of the
    window rather than an arg-max over a flat F1 curve)"""
    wm_min_episodes: int = 4
    """real episodes the online trainer holds before its first optimizer step"""
    wm_train_ratio: float = 0.5
    """world-model optimizer steps per real transition received (pacing against the simulator, like DreamerV3's
    train ratio); 0 = train as fast as the trainer's CPU allows"""
    wm_steps_per_publish: int = 20
    """world-model optimizer steps between publishes (a new wm_version for the imagination workers)"""
    start_episodes_per_publish: int = 8
    """newest real episodes shipped with each publish as imagination start states (workers keep the most recent
    wm.start_buffer_episodes of them)"""
    worker_cpus: float = 0.5
    """Ray CPU resource per imagination worker"""
    trainer_cpus: float = 0.5
    """Ray CPU resource of the world-model trainer"""
    trainer_gpus: float = 0.0
    """Ray GPU resource of the world-model trainer (it trains on cuda when > 0)"""

    @property
    def enabled(self) -> bool:
        return self.num_workers > 0

    def imagined_per_batch(self, batch_segments: int) -> int:
        return int(round(self.imagined_fraction * batch_segments))

    def __post_init__(self) -> None:
        for name in ("num_envs", "queue_capacity", "episode_queue_capacity", "wm_min_episodes", "wm_steps_per_publish",
                     "start_episodes_per_publish"):
            if getattr(self, name) < 1:
                raise ConfigError(f"imagination.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_workers < 0:
            raise ConfigError(f"imagination.num_workers must be >= 0, got {self.num_workers}")
        if not 0.0 <= self.imagined_fraction < 1.0:
            raise ConfigError(f"imagination.imagined_fraction={self.imagined_fraction} must be in [0, 1): the learner "
                              "needs simulator segments (the world model trains on them)")
        if self.enabled != (self.imagined_fraction > 0):
            raise ConfigError(f"imagination.num_workers={self.num_workers} and imagination.imagined_fraction="
                              f"{self.imagined_fraction} contradict; set both (e.g. imagination.num_workers=1 "
                              "imagination.imagined_fraction=0.5) or neither")
        if not 0.0 < self.record_fraction <= 1.0:
            raise ConfigError(f"imagination.record_fraction must be in (0, 1], got {self.record_fraction}")
        if self.wm_calibrate_frames < 0:
            raise ConfigError(f"imagination.wm_calibrate_frames must be >= 0 (0 = off), got {self.wm_calibrate_frames}")
        if self.wm_calibrate_rule not in CALIBRATE_RULES:
            rules = " or ".join(CALIBRATE_RULES)
            raise ConfigError(f"imagination.wm_calibrate_rule must be {rules}, got {self.wm_calibrate_rule!r}")
        if not 0.0 <= self.wm_replay_fraction < 1.0:
            raise ConfigError(f"imagination.wm_replay_fraction={self.wm_replay_fraction} must be in [0, 1): the world "
                              "model must also train on the run's own episodes (0 turns replay off)")
        if self.wm_train_ratio < 0 or min(self.worker_cpus, self.trainer_cpus, self.trainer_gpus) < 0:
            raise ConfigError("imagination.wm_train_ratio and the imagination CPU/GPU resources must be >= 0")


def check_imagination(cfg) -> None:
    """Cross-section checks for `imagination` (called by acce.config.Config); one error naming the fix."""
    im, b = cfg.imagination, cfg.learner.batch_segments
    if not im.enabled:
        return
    k = im.imagined_per_batch(b)
    if not 1 <= k <= b - 1:
        raise ConfigError(f"imagination.imagined_fraction={im.imagined_fraction} x learner.batch_segments={b} rounds "
                          f"to {k} imagined segments per batch; it must leave 1..{b - 1} (raise learner.batch_segments "
                          "or move the fraction)")
    if cfg.runtime.mode != "async":
        raise ConfigError("imagination needs runtime.mode=async (the sync barrier baseline has no imagination); "
                          "set imagination.num_workers=0 for sync runs")
    if k > im.queue_capacity:
        raise ConfigError(f"imagination.queue_capacity={im.queue_capacity} can never hold the {k} imagined segments of "
                          "a batch; raise it")
    if im.wm_replay_from and im.wm_replay_fraction > 0:
        from acce.data_kind import data_kind
        if data_kind(im.wm_replay_from) == "missing":
            raise ConfigError(f"imagination.wm_replay_from={im.wm_replay_from} is neither an acce episode store (no "
                              "zarr.json) nor a LeRobotDataset v3 folder (no meta/info.json); give the data the world "
                              "model was pretrained on (`acce collect --out PATH`) or leave it empty")
    if not im.wm_init_from and cfg.wm.image_size != cfg.env.image_size:
        raise ConfigError(f"wm.image_size={cfg.wm.image_size} differs from env.image_size={cfg.env.image_size}; the "
                          "world model must read the policy's images: set wm.image_size to env.image_size")
