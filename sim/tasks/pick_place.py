"""pick_place — "put the red cube on the yellow pad": grasp the named cube, carry it, release it on the pad."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.scene import CUBE_HALF_M, PAD_RADIUS_M, Scene
from sim.task import CUBE_TO_PAD_TEMPLATES, CubeToPadTask, TaskConfig, sample_separated_xy

CARRY_Z_M = 0.1
"""fingertip height for carrying"""
GRASP_Z_M = 0.006
"""fingertip height when closing on the cube (cube spans 0 .. 0.04 m)"""


@dataclass(frozen=True)
class PickPlaceConfig(TaskConfig):
    max_steps: int = 100
    """time limit in control steps (10 s at 10 Hz)"""
    success_radius_m: float = PAD_RADIUS_M - 0.01
    """the cube resting with its centre within this distance of the pad's centre, released, is success"""


class PickPlace(CubeToPadTask):
    name = "pick_place"
    config_cls = PickPlaceConfig
    train_templates = ("put the {cube} cube on the {pad} pad", "place the {cube} block onto the {pad} pad",
                       "pick up the {cube} cube and set it on the {pad} target", *CUBE_TO_PAD_TEMPLATES)
    heldout_templates = ("lift the {cube} box and drop it on the {pad} disc", "carry the {cube} cube over to the {pad} pad")
    val_templates = ("grab the {cube} cube and put it down on the {pad} pad",
                     "raise the {cube} block and set it onto the {pad} spot",
                     "clutch the {cube} cube and release it over the {pad} pad",
                     "take hold of the {cube} block and deposit it on the {pad} pad",
                     "hoist the {cube} cube onto the {pad} pad", "collect the {cube} block and leave it on the {pad} marker")
    # Every step before success costs (success ends the episode): a bonus for holding the cube lifted (+0.5 a step,
    # as before) paid more for hovering over the pad than the success bonus for releasing (docs/decisions.md)
    reward_weights = {"tip_to_cube_m": -0.5, "cube_to_pad_m": -2.0, "on_table": -0.5, "success": 10.0}

    def reset(self, scene: Scene, rng: np.random.Generator) -> dict[str, str]:
        others = self.choose_targets(rng)
        cube_xy, other_cube_xy, pad_xy, other_pad_xy = sample_separated_xy(rng, 4, 0.12, half_extent_m=0.17)
        return self.place(scene, rng, [cube_xy, pad_xy, other_cube_xy, other_pad_xy], others, 0.5, 1.0)

    def _holding(self, scene: Scene) -> bool:
        near = np.linalg.norm(scene.cube_pos(self.cube) - (scene.tip_pos + [0, 0, CUBE_HALF_M])) < 0.03
        return bool(near and 0.25 < scene.finger_opening < 0.75)

    def reward_terms(self, scene: Scene) -> dict[str, float]:
        return {"tip_to_cube_m": float(np.linalg.norm(scene.tip_pos - scene.cube_pos(self.cube))),
                "cube_to_pad_m": self.cube_to_pad(scene),
                "on_table": float(scene.cube_pos(self.cube)[2] <= CUBE_HALF_M + 0.02),
                "success": float(self.is_success(scene))}

    def is_success(self, scene: Scene) -> bool:
        resting = scene.cube_pos(self.cube)[2] < CUBE_HALF_M + 0.005
        return bool(self.cube_to_pad(scene) < self.config.success_radius_m and resting
                    and scene.finger_opening > 0.8)

    def expert_action(self, scene: Scene) -> np.ndarray:
        tip, cube, pad = scene.tip_pos, scene.cube_pos(self.cube), scene.pad_pos(self.pad)
        if self._holding(scene) and cube[2] > CUBE_HALF_M - 0.01:
            if np.linalg.norm(tip[:2] - pad[:2]) > 0.012:
                # lift straight up first, then carry at a safe height
                low = tip[2] < CARRY_Z_M - 0.02
                goal = np.array([*tip[:2], CARRY_Z_M]) if low else np.array([*pad[:2], CARRY_Z_M])
                return self.move_toward(scene, goal, grip=1.0)
            if tip[2] > GRASP_Z_M + 0.01:
                return self.move_toward(scene, np.array([*pad[:2], GRASP_Z_M]), grip=1.0)
            return self.move_toward(scene, tip, grip=-1.0)  # over the pad and low: release
        xy_err = np.linalg.norm(tip[:2] - cube[:2])
        if cube[2] < CUBE_HALF_M + 0.005 and self.cube_to_pad(scene) < self.config.success_radius_m:
            # released on the pad: open fully and back off upward
            return self.move_toward(scene, np.array([*tip[:2], CARRY_Z_M]), grip=-1.0)
        if xy_err > 0.008:
            z = CARRY_Z_M if xy_err > 0.02 else tip[2]
            if tip[2] < 0.06 and xy_err > 0.02:
                return self.move_toward(scene, np.array([*tip[:2], CARRY_Z_M]), grip=-1.0)
            return self.move_toward(scene, np.array([*cube[:2], z]), grip=-1.0)
        if tip[2] > GRASP_Z_M + 0.006 and scene.finger_opening > 0.8:
            return self.move_toward(scene, np.array([*cube[:2], GRASP_Z_M]), grip=-1.0)
        if scene.finger_opening > 0.7:
            return self.move_toward(scene, np.array([*cube[:2], GRASP_Z_M]), grip=1.0)  # close at the bottom
        return self.move_toward(scene, np.array([*cube[:2], CARRY_Z_M]), grip=1.0)  # closed: lift
