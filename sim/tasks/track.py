"""track — "touch the red ball": two balls circle the table; touch the named one before time runs out.

The dynamic task of the suite: both balls orbit the table centre counter-clockwise at `ball_speed_mps`, so where a
ball will be follows from where it is (visible in one image). A policy that acts on stale observations reaches for
where the ball was; the delay-aware learning issue measures exactly that. Make it harder with a faster ball.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.scene import BALL_RADIUS_M, Scene, SceneSpec
from sim.task import Task, TaskConfig

COLORS = ("red", "blue")


@dataclass(frozen=True)
class TrackConfig(TaskConfig):
    max_steps: int = 40
    """time limit in control steps (4 s at 10 Hz)"""
    ball_speed_mps: float = 0.12
    """linear speed of both balls along their circles"""
    touch_radius_m: float = 0.035
    """fingertip within this distance of the ball's centre counts as touching"""
    expert_speed_mps: float = 0.25
    """speed the expert assumes for itself when it computes where to intercept"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ball_speed_mps < 0:
            raise ValueError(f"ball_speed_mps must be >= 0, got {self.ball_speed_mps}")


class Track(Task):
    name = "track"
    config_cls = TrackConfig
    train_templates = ("touch the {color} ball", "catch the moving {color} ball", "reach the {color} ball",
                       "follow and touch the {color} sphere")
    heldout_templates = ("tap the rolling {color} ball", "intercept the {color} ball")
    val_templates = ("chase down the {color} ball", "get to the {color} sphere as it moves", "run into the {color} ball",
                     "hit the moving {color} ball", "meet the {color} ball on its path",
                     "go after the {color} ball and touch it")
    reward_weights = {"distance_m": -1.0, "success": 5.0}

    def scene_spec(self) -> SceneSpec:
        return SceneSpec(balls=COLORS)

    def reset(self, scene: Scene, rng: np.random.Generator) -> dict[str, str]:
        radii = rng.permutation([rng.uniform(0.08, 0.12), rng.uniform(0.16, 0.2)])
        self.radius = dict(zip(COLORS, radii))
        self.phase = {c: float(rng.uniform(-np.pi, np.pi)) for c in COLORS}
        for c in COLORS:
            scene.set_ball(c, self._ball_xy(c, 0.0))
        self.target = COLORS[int(rng.integers(len(COLORS)))]
        start = np.array([*rng.uniform(-0.2, 0.2, size=2), rng.uniform(0.08, 0.14)])
        scene.place_gripper(start, opening01=0.0)
        return {"color": self.target}

    def aux_targets(self, scene: Scene) -> np.ndarray:
        xy = scene.ball_pos(self.target)[:2]  # the object is the goal
        return np.concatenate([xy, xy]).astype(np.float32)

    def _ball_xy(self, color: str, dt_s: float) -> np.ndarray:
        """position dt_s seconds after the current phase (counter-clockwise orbit)"""
        angle = self.phase[color] + self.config.ball_speed_mps * dt_s / self.radius[color]
        return self.radius[color] * np.array([np.cos(angle), np.sin(angle)])

    def advance(self, scene: Scene, dt_s: float) -> None:
        for c in COLORS:
            self.phase[c] += self.config.ball_speed_mps * dt_s / self.radius[c]
            scene.set_ball(c, self._ball_xy(c, 0.0))

    def _distance(self, scene: Scene) -> float:
        return float(np.linalg.norm(scene.tip_pos - scene.ball_pos(self.target)))

    def reward_terms(self, scene: Scene) -> dict[str, float]:
        return {"distance_m": self._distance(scene), "success": float(self.is_success(scene))}

    def is_success(self, scene: Scene) -> bool:
        return self._distance(scene) < self.config.touch_radius_m

    def expert_action(self, scene: Scene) -> np.ndarray:
        # intercept: where will the ball be when we get there (fixed-point iteration on the travel time)
        lead_s = 0.1
        for _ in range(3):
            goal_xy = self._ball_xy(self.target, lead_s + 0.1)  # +0.1 s: the ball also moves during this step
            goal = np.array([*goal_xy, BALL_RADIUS_M])
            lead_s = float(np.linalg.norm(goal - scene.tip_pos)) / self.config.expert_speed_mps
        return self.move_toward(scene, goal, grip=1.0)
