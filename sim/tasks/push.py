"""push — "push the red cube onto the yellow pad": two cubes, two pads; push (no grasp) the named cube."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.scene import CUBE_HALF_M, PAD_RADIUS_M, Scene
from sim.task import CubeToPadTask, TaskConfig, sample_separated_xy

PUSH_Z_M = 0.012
"""fingertip height while pushing: below the cube's centre so the cube slides instead of tipping"""
CLEAR_Z_M = 0.08
"""fingertip height for moving over objects"""


@dataclass(frozen=True)
class PushConfig(TaskConfig):
    max_steps: int = 80
    """time limit in control steps (8 s at 10 Hz)"""
    success_radius_m: float = PAD_RADIUS_M - 0.01
    """the cube's centre within this distance of the pad's centre (in the table plane) is success"""


def _unit(v: np.ndarray) -> np.ndarray:
    return v / max(float(np.linalg.norm(v)), 1e-9)


class Push(CubeToPadTask):
    name = "push"
    config_cls = PushConfig
    train_templates = ("push the {cube} cube onto the {pad} pad", "slide the {cube} block to the {pad} pad",
                       "move the {cube} cube onto the {pad} target", "shove the {cube} cube to the {pad} circle")
    heldout_templates = ("nudge the {cube} box over to the {pad} pad", "get the {cube} cube onto the {pad} disc")
    reward_weights = {"tip_to_cube_m": -0.5, "cube_to_pad_m": -2.0, "success": 10.0}

    def reset(self, scene: Scene, rng: np.random.Generator) -> dict[str, str]:
        others = self.choose_targets(rng)
        while True:
            cube_xy, pad_xy, other_cube_xy, other_pad_xy = sample_separated_xy(rng, 4, 0.12, half_extent_m=0.17)
            dist = np.linalg.norm(pad_xy - cube_xy)
            # the distractor must not sit on the push path (a scripted pusher would just shove both)
            seg = pad_xy - cube_xy
            t = np.clip(np.dot(other_cube_xy - cube_xy, seg) / np.dot(seg, seg), 0.0, 1.0)
            if 0.12 <= dist <= 0.24 and np.linalg.norm(cube_xy + t * seg - other_cube_xy) > 0.1:
                break
        return self.place(scene, rng, [cube_xy, pad_xy, other_cube_xy, other_pad_xy], others, np.pi, 0.0)

    def reward_terms(self, scene: Scene) -> dict[str, float]:
        return {"tip_to_cube_m": float(np.linalg.norm(scene.tip_pos - scene.cube_pos(self.cube))),
                "cube_to_pad_m": self.cube_to_pad(scene), "success": float(self.is_success(scene))}

    def is_success(self, scene: Scene) -> bool:
        return self.cube_to_pad(scene) < self.config.success_radius_m

    def expert_action(self, scene: Scene) -> np.ndarray:
        cube, pad, tip = scene.cube_pos(self.cube)[:2], scene.pad_pos(self.pad)[:2], scene.tip_pos
        direction = _unit(pad - cube)
        rel = tip[:2] - cube
        along = float(np.dot(rel, direction))
        lateral = float(rel[0] * direction[1] - rel[1] * direction[0])
        behind = -(CUBE_HALF_M * 1.42 + 0.035) < along < -CUBE_HALF_M + 0.005
        if tip[2] < 0.03 and behind and abs(lateral) < 0.012:
            # aligned behind the cube: drive through its centre toward the pad (the line is re-aimed every step)
            goal = np.array([*(cube + direction * 0.03), PUSH_Z_M])
            return self.move_toward(scene, goal, grip=1.0)
        pre = cube - direction * (CUBE_HALF_M * 1.42 + 0.025)
        if tip[2] < CLEAR_Z_M - 0.02 and np.linalg.norm(rel) < 0.07 and not behind:
            # low and next to the cube but misaligned: lift straight up before re-approaching
            return self.move_toward(scene, np.array([tip[0], tip[1], CLEAR_Z_M]), grip=1.0)
        if np.linalg.norm(tip[:2] - pre) > 0.01:
            z = CLEAR_Z_M if np.linalg.norm(tip[:2] - pre) > 0.03 else tip[2]
            return self.move_toward(scene, np.array([*pre, z]), grip=1.0)
        return self.move_toward(scene, np.array([*pre, PUSH_Z_M]), grip=1.0)
