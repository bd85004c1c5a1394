"""What a task is: a scene spec, a seeded reset, per-step dynamics, raw reward terms, a success predicate, an
instruction template set with held-out paraphrases, and a scripted expert with privileged state.

A task is one file in `sim/tasks/` plus one line in the registry (`sim/tasks/__init__.py`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from sim.scene import CUBE_HALF_M, Scene, SceneSpec

CUBE_COLORS = ("red", "green", "blue")
PAD_COLORS = ("yellow", "magenta", "cyan")

TRAIN_SEEDS = range(0, 1_000_000)
"""episode seeds used for training and data collection"""
EVAL_SEEDS = range(1_000_000, 1_100_000)
"""episode seeds reserved for evaluation; disjoint from TRAIN_SEEDS so evaluation never leaks into training"""
VALIDATION_SEEDS = range(1_000_000, 1_050_000)
"""evaluation seeds for choices: periodic evaluations, early stopping, stop_at_success, presets, hyper-parameters"""
TEST_SEEDS = range(1_050_000, 1_100_000)
"""evaluation seeds for reported numbers only (a run's version-0 and final evaluation, `acce eval --split test`)"""
SEED_SPLITS = {"train": TRAIN_SEEDS, "val": VALIDATION_SEEDS, "test": TEST_SEEDS}
"""named seed ranges: training, validation, test"""
INSTRUCTION_SPLITS = ("train", "val", "heldout")
"""paraphrase sets: training, validation (held out, for choices), test (held out, for reported numbers)"""
AUX_DIM = 4
"""privileged auxiliary labels per frame (Task.aux_targets): the named object's table xy, then the goal's (m)"""


@dataclass(frozen=True)
class TaskConfig:
    """Knobs shared by every tabletop task (a task may subclass to add its own)."""

    max_steps: int = 50
    """time limit in control steps; the episode is truncated after it"""
    control_hz: float = 10.0
    """control rate; each control step runs round(1 / (control_hz * timestep)) physics steps"""
    max_step_m: float = 0.03
    """largest fingertip displacement one action of magnitude 1 commands (m per control step)"""

    def __post_init__(self) -> None:
        if self.max_steps <= 0:
            raise ValueError(f"max_steps must be positive, got {self.max_steps}")
        if self.control_hz <= 0:
            raise ValueError(f"control_hz must be positive, got {self.control_hz}")


class Task(ABC):
    """One language-conditioned task. Methods receive the Scene; the env owns stepping and rendering."""

    name: ClassVar[str]
    config_cls: ClassVar[type[TaskConfig]] = TaskConfig
    train_templates: ClassVar[tuple[str, ...]]
    """instruction templates used for training (str.format fields come from `reset`)"""
    val_templates: ClassVar[tuple[str, ...]]
    """paraphrases never used for training, for evaluations on validation seeds (choices, early stopping)"""
    heldout_templates: ClassVar[tuple[str, ...]]
    """paraphrases never used for training or validation: evaluations on test seeds (reported numbers)"""
    reward_weights: ClassVar[dict[str, float]]
    """reward = sum(weight * term); terms are logged raw"""

    def __init__(self, config: TaskConfig | None = None):
        self.config = config or self.config_cls()
        self.fields: dict[str, str] = {}

    @abstractmethod
    def scene_spec(self) -> SceneSpec: ...

    @abstractmethod
    def reset(self, scene: Scene, rng: np.random.Generator) -> dict[str, str]:
        """Randomize the layout (scene already reset) and return the instruction's template fields."""

    def advance(self, scene: Scene, dt_s: float) -> None:
        """Move whatever moves on its own (dynamic tasks) by one control step, before physics runs."""

    def after_physics(self, scene: Scene) -> None:
        """Update the task's progress from the stepped scene, before reward and success are read (a sequence task
        moves on to its next target here), so `reward_terms` and `is_success` stay side-effect free."""

    @abstractmethod
    def reward_terms(self, scene: Scene) -> dict[str, float]: ...

    @abstractmethod
    def is_success(self, scene: Scene) -> bool: ...

    @abstractmethod
    def expert_action(self, scene: Scene) -> np.ndarray:
        """(4,) action in [-1, 1] from privileged state: (dx, dy, dz) tip motion, gripper (+1 close, -1 open)."""

    @abstractmethod
    def aux_targets(self, scene: Scene) -> np.ndarray:
        """(AUX_DIM,) float32 privileged labels: the instruction's object xy, then its goal xy (m, table frame).

        Training-only supervision for a perception auxiliary loss (bc.aux_loss_coef): the simulator knows where
        things are, a robot does not, so these never enter the policy's inputs."""

    # --- helpers shared by the tasks ---------------------------------------------------------------------------
    def move_toward(self, scene: Scene, goal: np.ndarray, grip: float) -> np.ndarray:
        """Proportional Cartesian action toward a fingertip goal, saturated at one max step."""
        delta = (np.asarray(goal) - scene.tip_pos) / self.config.max_step_m
        norm = np.abs(delta).max()
        if norm > 1.0:
            delta = delta / norm
        return np.concatenate([delta, [grip]]).astype(np.float32)


def sample_separated_xy(rng: np.random.Generator, n: int, min_dist_m: float, half_extent_m: float = 0.2,
                        avoid: list[np.ndarray] | None = None, max_tries: int = 1000) -> list[np.ndarray]:
    """n points in the square [-h, h]^2, pairwise (and from `avoid`) at least min_dist_m apart."""
    points: list[np.ndarray] = []
    avoid = list(avoid or [])
    for _ in range(max_tries):
        p = rng.uniform(-half_extent_m, half_extent_m, size=2)
        if all(np.linalg.norm(p - q[:2]) >= min_dist_m for q in points + avoid):
            points.append(p)
            if len(points) == n:
                return points
    raise RuntimeError(f"could not place {n} objects {min_dist_m} m apart; enlarge the area or reduce objects")


def cube_on_table(scene: Scene, color: str) -> bool:
    return bool(scene.cube_pos(color)[2] < CUBE_HALF_M + 0.005)


CUBE_TO_PAD_TEMPLATES = ("move the {cube} cube to the {pad} pad", "bring the {cube} block to the {pad} pad",
                         "the {cube} cube belongs on the {pad} pad", "relocate the {cube} cube to the {pad} circle")
"""training wording shared by push and pick_place: it names the goal, not the manner, so the policy learns to settle
the manner from the scene (the gripper starts closed for push, open for pick_place) where words do not"""


class CubeToPadTask(Task):
    """Shared layout of the two-cube, two-pad tasks (push, pick_place): which cube to which pad is in the
    instruction; the other cube and pad are distractors."""

    def scene_spec(self) -> SceneSpec:
        return SceneSpec(cubes=CUBE_COLORS[:2], pads=PAD_COLORS[:2])

    def choose_targets(self, rng: np.random.Generator) -> tuple[str, str]:
        """Pick the named cube and pad; returns the distractor cube and pad."""
        cubes, pads = CUBE_COLORS[:2], PAD_COLORS[:2]
        self.cube = cubes[int(rng.integers(2))]
        self.pad = pads[int(rng.integers(2))]
        return next(c for c in cubes if c != self.cube), next(p for p in pads if p != self.pad)

    def place(self, scene: Scene, rng: np.random.Generator, xy: list[np.ndarray], others: tuple[str, str],
              max_yaw_rad: float, opening01: float) -> dict[str, str]:
        """xy = (cube, pad, other cube, other pad) positions; then the gripper starts above the table."""
        scene.set_cube(self.cube, xy[0], yaw_rad=float(rng.uniform(-max_yaw_rad, max_yaw_rad)))
        scene.set_cube(others[0], xy[2], yaw_rad=float(rng.uniform(-max_yaw_rad, max_yaw_rad)))
        scene.set_pad(self.pad, xy[1])
        scene.set_pad(others[1], xy[3])
        start = np.array([*rng.uniform(-0.15, 0.15, size=2), rng.uniform(0.1, 0.18)])
        scene.place_gripper(start, opening01=opening01)
        return {"cube": self.cube, "pad": self.pad}

    def aux_targets(self, scene: Scene) -> np.ndarray:
        return np.concatenate([scene.cube_pos(self.cube)[:2], scene.pad_pos(self.pad)[:2]]).astype(np.float32)

    def cube_to_pad(self, scene: Scene) -> float:
        return float(np.linalg.norm(scene.cube_pos(self.cube)[:2] - scene.pad_pos(self.pad)[:2]))
