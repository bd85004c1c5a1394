"""LearnerConfig: the RL learner's schema (Config field `learner`), split from acce/config.py by size. Plain
dataclass, no torch; `acce.config` re-exports it."""
from __future__ import annotations

from dataclasses import dataclass

from acce.configlib import ConfigError


@dataclass(frozen=True)
class LearnerConfig:
    algorithm: str = "ppo"
    """'ppo' (decoupled PPO clipping), 'gipo' (AcceRL's Gaussian log-ratio trust weight), or 'td3': off-policy
    residual RL from a replay of the frozen trunk's features (acce/runtime/offpolicy.py; needs
    train_scope=residual)"""
    advantage: str = "gae"
    """'gae' or 'vtrace'"""
    gamma: float = 0.99
    """per control step discount; a decision's bootstrap discount is gamma^(span length)"""
    lam: float = 0.95
    """GAE / V-trace lambda, applied once per decision"""
    lr: float = 3e-4
    """Adam learning rate"""
    critic_lr: float = 1e-3
    """Adam learning rate of the value head when it reads the trunk through a stop-gradient
    (policy.value_stop_gradient); 0 = learner.lr"""
    batch_segments: int = 16
    """segments per update"""
    epochs: int = 2
    """passes over each batch"""
    minibatches: int = 2
    """minibatches per pass; optimizer steps per update = epochs * minibatches (each is one learner_version)"""
    clip_eps: float = 0.2
    """PPO clip range against the proximal policy"""
    gipo_sigma: float = 0.5
    """GIPO: width of the Gaussian trust weight in log-ratio space"""
    is_cap: float = 2.0
    """truncation of the behavior importance weight"""
    vtrace_rho_bar: float = 1.0
    """V-trace rho truncation"""
    vtrace_c_bar: float = 1.0
    """V-trace trace-cutting truncation"""
    vf_coef: float = 0.5
    """value loss weight"""
    value_clip: float | None = None
    """PPO-style value clipping range (None: off)"""
    ent_coef: float = 0.0
    """entropy bonus weight"""
    ref_kl_coef: float = 0.0
    """weight of KL(π ‖ π_ref), the chunk distribution's divergence from the policy RL started from (the warm start,
    frozen at the first update and kept in checkpoints), on every minibatch's observations; anchors RL fine-tuning
    to what cloning taught (0: off)"""
    anchor_tasks: tuple[str, ...] = ()
    """train_scope=residual: tasks whose decisions are held at the warm start, e.g. [reach] where cloning already
    succeeds; the shared residual then moves only for the others (learner.anchor_coef; () = off)"""
    anchor_coef: float = 0.0
    """weight of the anchor: the KL from the cloned action head's chunk to the policy's, at the policy's own
    (detached) std, i.e. the residual's correction in units of exploration noise, averaged over each minibatch's
    decisions of learner.anchor_tasks (so it does not fade as those tasks get fewer episodes)"""
    max_grad_norm: float = 1.0
    """gradient clipping"""
    train_scope: str = "all"
    """what RL trains: 'all' (every trainable weight) or 'residual' (only policy.residual_hidden's residual head,
    log_std and the critic: residual RL on the frozen warm start; the trunk's features come from one no-grad pass
    per update and every minibatch reuses them, so an epoch costs a fraction of a full forward and backward)"""
    aux_coef: float = 0.0
    """weight of the aux head's loss on the rollouts' privileged labels during RL (0: off; needs train_scope=all and
    aux labels in the rollouts, i.e. policy.critic=privileged): the encoder that RL trains keeps learning where the
    named object and goal are, with cloning's standardization (kept in the policy)"""
    target_kl: float = 0.0
    """adaptive actor learning rate (0 = off, fixed learner.lr): per minibatch, the approx KL(π_prox ‖ π) of the
    executed span already moved in this update; above 2x target the rate is divided by 1.5, below half of it (and
    > 0) multiplied by 1.5, within [lr_min, lr_max] (rsl_rl's adaptive schedule). Keeps every update's step size
    where PPO works whatever the batch, epochs and task; the rate starts at learner.lr and is checkpointed"""
    kl_stop: float = 0.0
    """early stop of an update's epochs (0 = off; CleanRL's / Spinning Up's target_kl): before each optimizer step
    the minibatch's approx KL(π_prox ‖ π) is compared with 1.5 x kl_stop, and past it the update ends (the remaining
    minibatches and epochs are skipped; `learner/opt_steps` shows how many ran). Bounds how far one update moves the
    policy whatever epochs x minibatches is, at a fixed learning rate"""
    critic_tail: bool = False
    """after learner.kl_stop ends an update's policy steps, its remaining minibatches and epochs still fit the critic
    (value loss only; `learner/critic_tail_steps` counts them). They change no actor weight, so they are not versions.
    Without it a stop after one or two steps leaves the critic one or two steps per update (explained variance near
    0, advantages that are mostly noise). Needs a critic that shares no weight with the actor (policy.critic=
    privileged, policy.value_stop_gradient or train_scope=residual) and kl_stop > 0"""
    lr_min: float = 1e-6
    """lower bound of the adaptive learning rate (learner.target_kl)"""
    lr_max: float = 1e-3
    """upper bound of the adaptive learning rate (learner.target_kl)"""
    recompute_values: bool = True
    """recompute values with the current critic before advantages (else use the behavior values)"""
    normalize_values: bool = True
    """the critic predicts value targets standardized by running statistics of every target seen (mean/std, kept in
    checkpoints); values are de-standardized before advantages. Without it the value loss grew 16 -> 81 over the
    main job's RL (push returns span about -35 .. +100)"""
    normalize_advantages: bool = True
    """standardize advantages per update"""
    max_staleness: int = 8
    """largest learner_version - behavior_version admitted (pacing); -1 = unbounded"""
    delay_correction: bool = True
    """delay-aware learning (docs/design.md §5); false = the naive baseline"""
    rl_log_std: float | None = None
    """log_std of every chunk position when RL starts (a fresh run, from the warm start or from scratch; a resumed
    run keeps its own): exploration noise sized for RL, not the cloning default (None = keep the policy's)"""
    rl_log_std_per_dim: tuple[float, ...] = ()
    """log_std per action dimension when RL starts, overriding rl_log_std (every chunk position alike); () = off.
    Noise sized per dimension: a gripper command that must swing from +1 to -1 to reopen needs far more than a
    fingertip motion's"""
    value_warmup_updates: int = 0
    """first updates train only the critic (policy-gradient weight 0): a warm-started actor is not pushed around by
    advantages from an untrained critic"""

    utd: float = 2.0
    """td3: gradient steps per new decision (update-to-data ratio); an update's optimizer steps = ceil(utd x its
    decisions)"""
    td3_batch: int = 256
    """td3: transitions per gradient step, sampled uniformly from the replay"""
    replay_decisions: int = 30_000
    """td3: replay capacity in decisions (oldest overwritten; about 3 kB of features each)"""
    tau: float = 0.005
    """td3: Polyak rate of the target Q heads"""
    actor_every: int = 2
    """td3: one actor step per this many critic steps (TD3's delayed policy update)"""
    bc_alpha: float = 2.5
    """td3: TD3+BC's alpha, the weight of -Q (scaled by 1 / mean|Q|) against the mean squared residual over the
    executed span; larger = more RL, less warm start"""
    target_noise: float = 0.1
    """td3: std of the target policy's smoothing noise (action units)"""
    target_noise_clip: float = 0.25
    """td3: clip of that noise"""
    q_hidden: int = 256
    """td3: width of each Q head's two hidden layers"""

    @property
    def steps_per_update(self) -> int:
        return self.epochs * self.minibatches

    def __post_init__(self) -> None:
        if self.algorithm not in ("ppo", "gipo", "td3"):
            raise ConfigError(f"learner.algorithm must be 'ppo', 'gipo' or 'td3', got {self.algorithm!r}")
        if self.algorithm == "td3" and self.train_scope != "residual":
            raise ConfigError("learner.algorithm=td3 trains a residual head on frozen features: set "
                              "learner.train_scope=residual (and policy.residual_hidden > 0)")
        if min(self.utd, self.td3_batch, self.replay_decisions, self.actor_every, self.q_hidden) <= 0 \
                or not 0 < self.tau <= 1 or min(self.bc_alpha, self.target_noise, self.target_noise_clip) < 0:
            raise ConfigError("learner.utd, td3_batch, replay_decisions, actor_every and q_hidden must be positive, "
                              "tau in (0, 1], bc_alpha and target_noise(_clip) >= 0")
        if self.advantage not in ("gae", "vtrace"):
            raise ConfigError(f"learner.advantage must be 'gae' or 'vtrace', got {self.advantage!r}")
        if not 0 < self.gamma <= 1 or not 0 <= self.lam <= 1:
            raise ConfigError("learner.gamma must be in (0, 1] and learner.lam in [0, 1]")
        if self.train_scope not in ("all", "residual"):
            raise ConfigError(f"learner.train_scope must be 'all' or 'residual', got {self.train_scope!r}")
        if not self.aux_coef >= 0 or (self.aux_coef > 0 and self.train_scope != "all"):
            raise ConfigError(f"learner.aux_coef must be >= 0 and needs learner.train_scope=all (a residual scope "
                              f"freezes the encoder it would train), got {self.aux_coef} with {self.train_scope!r}")
        if self.anchor_coef < 0 or bool(self.anchor_tasks) != (self.anchor_coef > 0) or (
                self.anchor_tasks and (self.train_scope != "residual" or self.algorithm == "td3")):
            raise ConfigError(f"learner.anchor_tasks and learner.anchor_coef > 0 go together and need learner."
                              f"train_scope=residual with ppo or gipo (td3 keeps its residual near the warm start "
                              f"with learner.bc_alpha), got {list(self.anchor_tasks)}, {self.anchor_coef}, "
                              f"{self.train_scope!r}, {self.algorithm!r}")
        if self.critic_tail and self.kl_stop <= 0:
            raise ConfigError("learner.critic_tail fits the critic after an early stop at learner.kl_stop: set "
                              "kl_stop > 0 or critic_tail=false")
        if not self.kl_stop >= 0:
            raise ConfigError(f"learner.kl_stop must be >= 0 (0 = off), got {self.kl_stop}")
        if self.target_kl < 0 or (self.target_kl > 0 and not 0 < self.lr_min <= self.lr <= self.lr_max):
            raise ConfigError(f"learner.target_kl must be >= 0 and learner.lr_min <= learner.lr <= learner.lr_max, got "
                              f"{self.target_kl}, {self.lr_min} <= {self.lr} <= {self.lr_max}")
        if min(self.batch_segments, self.epochs, self.minibatches) <= 0:
            raise ConfigError("learner.batch_segments, learner.epochs and learner.minibatches must be positive")
