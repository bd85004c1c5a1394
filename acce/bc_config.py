"""`bc.*`: the behavior-cloning warm start (scripted demos, DAgger, perception aux loss, random-latency cloning)."""
from __future__ import annotations

from dataclasses import dataclass, field

from acce.configlib import ConfigError


@dataclass(frozen=True)
class BCConfig:
    episodes: int = 0
    """scripted-expert episodes recorded for the behavior-cloning warm start (0: start RL from scratch)"""
    steps: int = 0
    """supervised steps on them before RL (the result is version 0 that every actor starts from)"""
    batch_size: int = 128
    """decisions per BC step"""
    lr: float = 1e-3
    """Adam learning rate of the warm start (RL then uses learner.lr with fresh optimizer moments)"""
    lr_schedule: str = "cosine"
    """'cosine' (decay from bc.lr to 0 over bc.steps, or over bc.max_wall_s when that binds first) or 'constant'"""
    phase_schedule: str = "restart"
    """how the cloning phases between DAgger rounds share the schedule: 'restart' (each phase starts at bc.lr with
    fresh Adam moments and runs its own cosine) or 'continuous' (one cosine over all phases, the optimizer kept: a
    DAgger round only adds data, and no phase spends its first steps at the peak rate again)"""
    max_wall_s: float = 0.0
    """wall-clock budget of all cloning phases together, in seconds (0 = none): cloning stops at bc.steps or here,
    whichever comes first, split evenly over the phases like bc.steps (DAgger rollouts not counted); the cosine
    schedule runs over whichever budget binds, so a slower CPU clones fewer steps but finishes in time"""
    augment_shift_px: int = 3
    """random-shift image augmentation of BC batches in pixels (0: off). Not used in RL: the importance ratio
    must compare log-probs of the same input, and the behavior policy saw unaugmented images"""
    noise_std: float = 0.1
    """expert action noise while recording (state diversity)"""
    dagger_rounds: int = 0
    """DAgger rounds after cloning the demos: run the cloned policy, label every state it reached with the scripted
    expert's action, add them to the data, clone again (bc.steps is split evenly over the rounds + 1 phases)"""
    dagger_episodes: int = 300
    """policy episodes per DAgger round, split over env.tasks"""
    dagger_targets: str = "expert"
    """what a DAgger round's states teach: 'expert' (the scripted expert's action labels, cloned like demos) or
    'aux' (only the aux head, from the simulator's privileged positions; needs bc.aux_loss_coef > 0): the encoder
    learns to locate objects in the states the policy reaches while the action targets stay the demos'. For
    experts whose labels jump between saturated actions near a boundary (docs/decisions.md)"""
    dagger_groups: int = 2
    """env groups per task in a DAgger round, each env.num_envs envs on its own thread with its own generator: one
    group steps while another's batch is in the policy (1 = one group, the previous behaviour and data)"""
    task_weights: dict[str, float] = field(default_factory=dict)
    """relative share of each task in the recorded demos and the DAgger episodes, e.g. {push: 3} to spend them on
    the task that clones worst; a task not named weighs 1, a weight for a task outside env.tasks is unused; {} =
    evenly. Cloning batches draw every decision equally likely, so a task's share of them follows its steps"""
    aux_loss_coef: float = 0.0
    """weight of the perception auxiliary loss (0 = off): demos and DAgger rollouts record the simulator's
    privileged positions of the instruction's object and goal (obs["aux"]), and an aux head on the trunk's action
    query regresses them (standardized) during cloning. They are targets only, never inputs, so the policy still
    acts from pixels; it makes the encoder localize what the instruction names"""
    aux_frames: int = 0
    """extra frames for the aux head alone (0 = none; needs aux_loss_coef > 0): training-seed layouts just after reset
    and a few random actions, labelled by the simulator's privileged positions, with no action target. In a demo
    the arm is already heading for the goal, so an aux head can read the goal off the arm instead of the image
    (docs/decisions.md); here the arm says nothing about it. No expert is involved: only demos are scarce"""
    aux_only_share: float | None = None
    """share of each cloning batch drawn from the rows with no action target (bc.aux_frames, and DAgger states
    under bc.dagger_targets='aux'), the rest from rows with one; None = every row equally likely, so the aux-only rows'
    share follows their count, which after aux-only DAgger rounds can leave few rows to clone actions from
    (docs/decisions.md). Used only once the data holds both kinds"""
    random_delay_steps: int = 0
    """clone every decision at a latency d drawn uniformly from 0 … this many control steps, with the delay-aware
    inputs (d and the committed prefix) a policy sees at that latency; 0 = every decision at d = 0. A warm start for
    the delay-aware learner (learner.delay_correction=true, whose policy reads those inputs); DAgger rounds then run
    the policy at such latencies too, so the expert labels the states latency leads to. At most
    policy.max_delay_steps"""
    min_delay_steps: int = 0
    """with random_delay_steps: the smallest latency drawn, in control steps (equal to random_delay_steps: every
    decision is cloned at that one latency, e.g. the deployment's)"""
    delay_inputs: bool = True
    """with random_delay_steps: give the policy the delay-aware inputs. false clones a delay-naive policy for those
    latencies (learner.delay_correction=false): the loss still skips the chunk positions < d that never execute, but
    its inputs say d = 0 with no prefix, as a naive learner's actors send; DAgger runs it that way too. This is the
    latency-matched naive baseline (`acce bench delay --naive-at-latency`)"""

    def __post_init__(self) -> None:
        if self.random_delay_steps < 0:
            raise ConfigError(f"bc.random_delay_steps must be >= 0 control steps, got {self.random_delay_steps}")
        if self.min_delay_steps and not 0 <= self.min_delay_steps <= self.random_delay_steps:
            raise ConfigError(f"bc.min_delay_steps={self.min_delay_steps} must be in [0, bc.random_delay_steps="
                              f"{self.random_delay_steps}]")
        if self.dagger_rounds < 0 or self.dagger_episodes < 0 or self.dagger_groups < 1:
            raise ConfigError("bc.dagger_rounds and bc.dagger_episodes must be >= 0, bc.dagger_groups >= 1")
        if self.dagger_targets not in ("expert", "aux"):
            raise ConfigError(f"bc.dagger_targets must be 'expert' or 'aux', got {self.dagger_targets!r}")
        if self.dagger_targets == "aux" and not self.aux_loss_coef > 0:
            raise ConfigError("bc.dagger_targets='aux' trains only the aux head on the DAgger states: set "
                              "bc.aux_loss_coef > 0 too")
        if not self.aux_loss_coef >= 0:
            raise ConfigError(f"bc.aux_loss_coef must be >= 0 (0 = off), got {self.aux_loss_coef}")
        if self.aux_frames < 0 or (self.aux_frames and not self.aux_loss_coef > 0):
            raise ConfigError(f"bc.aux_frames={self.aux_frames}: give a count >= 0, and bc.aux_loss_coef > 0 to use "
                              "them (they train only the aux head)")
        if self.aux_only_share is not None and not 0.0 <= self.aux_only_share < 1.0:
            raise ConfigError(f"bc.aux_only_share must be in [0, 1) (the rest of each batch clones actions) or null "
                              f"(rows drawn by count), got {self.aux_only_share}")
        if self.aux_only_share is not None and not self.aux_loss_coef > 0:
            raise ConfigError("bc.aux_only_share sets the share of aux-only rows, which train only the aux head: "
                              "set bc.aux_loss_coef > 0 too")
        if not self.max_wall_s >= 0:
            raise ConfigError(f"bc.max_wall_s must be >= 0 seconds (0 = no time budget), got {self.max_wall_s}")
        if self.phase_schedule not in ("restart", "continuous"):
            raise ConfigError(f"bc.phase_schedule must be 'restart' or 'continuous', got {self.phase_schedule!r}")
        if self.lr_schedule not in ("cosine", "constant"):
            raise ConfigError(f"bc.lr_schedule must be 'cosine' or 'constant', got {self.lr_schedule!r}")
