"""reach — "touch the red cube": three cubes; which one is named only by the instruction, where only by the image."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.scene import CUBE_HALF_M, Scene, SceneSpec
from sim.task import Task, TaskConfig, sample_separated_xy

COLORS = ("red", "green", "blue")


@dataclass(frozen=True)
class ReachConfig(TaskConfig):
    max_steps: int = 40
    """time limit in control steps (4 s at 10 Hz)"""
    touch_radius_m: float = 0.035
    """fingertip within this distance of the cube's top-face centre counts as touching"""


class Reach(Task):
    name = "reach"
    config_cls = ReachConfig
    train_templates = ("touch the {color} cube", "reach the {color} cube", "move to the {color} block",
                       "go to the {color} cube", "put the gripper on the {color} block")
    heldout_templates = ("tap the {color} box", "make contact with the {color} cube")
    val_templates = ("press against the {color} cube", "bring the fingertips to the {color} block",
                     "poke the {color} cube", "place the gripper against the {color} cube",
                     "head over to the {color} block and touch it", "put your fingers on the {color} cube")
    reward_weights = {"distance_m": -1.0, "success": 5.0}

    def scene_spec(self) -> SceneSpec:
        return SceneSpec(cubes=COLORS)

    def reset(self, scene: Scene, rng: np.random.Generator) -> dict[str, str]:
        for color, xy in zip(COLORS, sample_separated_xy(rng, len(COLORS), min_dist_m=0.1, half_extent_m=0.18)):
            scene.set_cube(color, xy, yaw_rad=float(rng.uniform(-np.pi, np.pi)))
        self.target = COLORS[int(rng.integers(len(COLORS)))]
        start = np.array([*rng.uniform(-0.15, 0.15, size=2), rng.uniform(0.12, 0.2)])
        scene.place_gripper(start, opening01=1.0)
        return {"color": self.target}

    def _goal(self, scene: Scene) -> np.ndarray:
        return scene.cube_pos(self.target) + np.array([0.0, 0.0, CUBE_HALF_M])

    def aux_targets(self, scene: Scene) -> np.ndarray:
        xy = scene.cube_pos(self.target)[:2]  # the object is the goal
        return np.concatenate([xy, xy]).astype(np.float32)

    def reward_terms(self, scene: Scene) -> dict[str, float]:
        return {"distance_m": float(np.linalg.norm(scene.tip_pos - self._goal(scene))),
                "success": float(self.is_success(scene))}

    def is_success(self, scene: Scene) -> bool:
        return bool(np.linalg.norm(scene.tip_pos - self._goal(scene)) < self.config.touch_radius_m)

    def expert_action(self, scene: Scene) -> np.ndarray:
        return self.move_toward(scene, self._goal(scene), grip=1.0)
