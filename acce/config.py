"""The config schema: frozen dataclasses, one docstring per field. YAML presets in configs/ only set values.

`acce train --config configs/default.yaml learner.lr=3e-4` -> `load(path, overrides)`; contradictions are rejected
in `__post_init__` with the fix in the message.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from acce.configlib import ConfigError, load_config

KNOWN_TASKS = ("reach", "push", "pick_place", "track")
"""tabletop tasks (sim.tasks.TASKS; a test keeps the two in sync; acce must not import sim)"""


@dataclass(frozen=True)
class RunConfig:
    name: str = "acce"
    """run name; the run directory is <out_dir>/<name>"""
    out_dir: str = "runs"
    """parent folder of run directories"""
    seed: int = 0
    """master seed: env layouts, task sampling, network init"""

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name


@dataclass(frozen=True)
class EnvConfig:
    tasks: tuple[str, ...] = ("reach", "push")
    """tasks trained on (and evaluated on) together"""
    num_envs: int = 8
    """envs per rollout worker (stepped in lockstep, one inference request per chunk per env)"""
    image_size: int = 64
    """square camera resolution in pixels"""
    cameras: tuple[str, ...] = ("front",)
    """camera names; observation keys are image/<camera>"""
    task_params: dict[str, dict[str, float]] = field(default_factory=dict)
    """per-task overrides of the task's config, e.g. {track: {ball_speed_mps: 0.2}}"""

    def __post_init__(self) -> None:
        unknown = [t for t in self.tasks if t not in KNOWN_TASKS and not t.startswith("metaworld/")]
        if unknown:
            raise ConfigError(f"env.tasks: unknown task(s) {unknown}; known: {list(KNOWN_TASKS)} or metaworld/<name>-v3")
        if not self.tasks:
            raise ConfigError("env.tasks is empty; name at least one task, e.g. env.tasks=[reach]")
        if self.num_envs <= 0:
            raise ConfigError(f"env.num_envs must be positive, got {self.num_envs}")
        if not 16 <= self.image_size <= 512:
            raise ConfigError(f"env.image_size must be in [16, 512], got {self.image_size}")
        bad = [t for t in self.task_params if t not in self.tasks]
        if bad:
            raise ConfigError(f"env.task_params names task(s) {bad} that are not in env.tasks {list(self.tasks)}")


@dataclass(frozen=True)
class CollectConfig:
    tasks: tuple[str, ...] = ("reach",)
    """tasks to record, episodes split evenly between them"""
    policy: str = "expert"
    """who acts: 'expert' (scripted, privileged state)"""
    episodes: int = 100
    """episodes to record in total"""
    noise_std: float = 0.0
    """Gaussian action noise added to the expert (diverse data); 0 for clean demonstrations"""
    noisy_fraction: float = 0.0
    """fraction of episodes recorded with noise_std (the rest clean); 1.0 makes every episode noisy"""
    seeds: str = "train"
    """seed range to draw layouts from: 'train' or 'test' (evaluation seeds; never train on them)"""
    instruction_split: str = "train"
    """instruction paraphrases: 'train' or 'heldout'"""
    num_envs: int = 8
    """envs stepped together while recording"""
    out: str = "data/episodes.zarr"
    """zarr episode store; appended to when it exists with the same schema"""

    def __post_init__(self) -> None:
        if self.policy != "expert":
            raise ConfigError(f"collect.policy={self.policy!r} is not supported; use 'expert'")
        if self.episodes <= 0:
            raise ConfigError(f"collect.episodes must be positive, got {self.episodes}")
        if self.seeds not in ("train", "test"):
            raise ConfigError(f"collect.seeds must be 'train' or 'test', got {self.seeds!r}")
        if self.instruction_split not in ("train", "heldout"):
            raise ConfigError(f"collect.instruction_split must be 'train' or 'heldout', got {self.instruction_split!r}")
        if not 0.0 <= self.noisy_fraction <= 1.0 or self.noise_std < 0:
            raise ConfigError("collect.noisy_fraction must be in [0, 1] and collect.noise_std >= 0")


@dataclass(frozen=True)
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    """run name, output folder, seed"""
    env: EnvConfig = field(default_factory=EnvConfig)
    """simulated tasks and observation format"""
    collect: CollectConfig = field(default_factory=CollectConfig)
    """`acce collect`: recording scripted-expert episodes to the episode store"""


def load(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    return load_config(Config, path, overrides)
