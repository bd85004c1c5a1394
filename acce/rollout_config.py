"""RolloutConfig and DelayConfig: the actors' schema (Config fields `rollout`, `delay`), split from acce/config.py
by size. Plain dataclasses; `acce.config` re-exports them."""
from __future__ import annotations

from dataclasses import dataclass

from acce.configlib import ConfigError


@dataclass(frozen=True)
class RolloutConfig:
    segment_len: int = 8
    """T: decisions per segment (one env); a segment is complete or not sent"""
    execution_horizon: int = 4
    """s: control steps between requests; each chunk runs s actions (more with delay overlap)"""
    num_workers: int = 2
    """rollout workers (each owns env.num_envs envs)"""
    task_sampling: str = "uniform"
    """'uniform' over env.tasks, or 'failure' (probability proportional to recent failures + 1, as AcceRL)"""
    failure_window: int = 50
    """episodes per task remembered by failure-weighted sampling"""
    min_task_share: float = 0.0
    """failure-weighted sampling: every task's probability is at least this fraction (0 = none), so a task the warm
    start already solves keeps sending the learner episodes that hold the shared policy where it succeeds"""
    replay_failed: float = 0.0
    """probability that a training env's next episode replays the layout (task and episode seed) of one of its
    workers' earlier failed episodes instead of a fresh one (failed-layout replay, in the spirit of prioritized level
    replay); each failure is replayed once, and queued again only if it fails again. 0 = fresh layouts only.
    Evaluation never replays; training-success metrics count fresh layouts only (docs/decisions.md)"""
    replay_capacity: int = 64
    """failed layouts each rollout worker keeps for replay_failed, oldest dropped first"""
    align_decisions: bool = True
    """a worker holds an env whose decision falls due (after a reset, mid-way through the others' chunks) until none
    of its other envs can step, so that its envs decide in one inference batch instead of drifting into up to
    execution_horizon smaller ones; the held env idles at most execution_horizon - 1 control steps per episode.
    Blocking workers only (a pipelined worker already overlaps its requests with stepping). Evaluation envs do the
    same; their outcome per seed does not change (docs/decisions.md, "Decisions in one batch")"""

    def __post_init__(self) -> None:
        if self.segment_len <= 0 or self.execution_horizon <= 0 or self.num_workers <= 0:
            raise ConfigError("rollout.segment_len, rollout.execution_horizon and rollout.num_workers must be > 0")
        if self.task_sampling not in ("uniform", "failure"):
            raise ConfigError(f"rollout.task_sampling must be 'uniform' or 'failure', got {self.task_sampling!r}")
        if not 0.0 <= self.min_task_share <= 1.0:
            raise ConfigError(f"rollout.min_task_share must be in [0, 1], got {self.min_task_share}")
        if not 0.0 <= self.replay_failed < 1.0:
            raise ConfigError(f"rollout.replay_failed must be in [0, 1) (a probability; 1 would never draw a fresh "
                              f"layout), got {self.replay_failed}")
        if self.replay_capacity <= 0:
            raise ConfigError(f"rollout.replay_capacity must be positive, got {self.replay_capacity}")


@dataclass(frozen=True)
class DelayConfig:
    model: str = "fixed"
    """inference latency model: 'fixed' | 'uniform' | 'empirical' | 'measured' (the wall-clock latency the worker
    observed on its previous inference request; docs/design.md §5)"""
    fixed_steps: int = 0
    """d for model=fixed, in control steps (0 = no latency)"""
    low_s: float = 0.0
    """model=uniform: smallest latency in seconds"""
    high_s: float = 0.0
    """model=uniform: largest latency in seconds"""
    path: str = ""
    """model=empirical: file of measured latencies in seconds (JSON {"latency_s": [...]} or one per line)"""

    def __post_init__(self) -> None:
        if self.model not in ("fixed", "uniform", "empirical", "measured"):
            raise ConfigError(f"delay.model must be fixed, uniform, empirical or measured, got {self.model!r}")
        if self.model == "empirical" and not self.path:
            raise ConfigError("delay.model=empirical needs delay.path (a file of measured latencies)")
