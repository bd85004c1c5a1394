"""push — "push the red cube onto the yellow pad": two cubes, two pads; push (no grasp) the named cube."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.scene import CUBE_HALF_M, PAD_RADIUS_M, Scene
from sim.task import CUBE_TO_PAD_TEMPLATES, CubeToPadTask, TaskConfig, sample_separated_xy

PUSH_Z_M = 0.012
"""fingertip height while pushing: below the cube's centre so the cube slides instead of tipping"""
PUSH_CONTACT_GAP_M = 0.01
"""centre of the fingertip behind the cube's face when touching it (about the fingertip's radius)"""
PRE_PUSH_BACK_M = 0.06
"""the expert descends this far behind the cube's centre (on the cube-pad line): far enough that a cloned policy's
centimetre-level position error does not land it on the cube"""
PUSH_LATERAL_TOL_M = 0.025
"""the expert pushes from behind when within this distance of the cube-pad line (and steers onto it); further off it
lifts and re-approaches. On 100 test seeds: 74 % vs 58 % at action noise 0.6 against the earlier 1.2 cm
tolerance and 4.3 cm pre-push point (tests/sim/test_tasks.py), but 92 % vs 99 % at noise 0.3 (`acce bench experts`);
clean episodes stay 15 steps"""
CLEAR_Z_M = 0.08
"""fingertip height for moving over objects"""


@dataclass(frozen=True)
class PushConfig(TaskConfig):
    max_steps: int = 80
    """time limit in control steps (8 s at 10 Hz)"""
    success_radius_m: float = PAD_RADIUS_M - 0.01
    """the cube's centre within this distance of the pad's centre (in the table plane) is success"""
    descent_funnel_m: float = 0.0
    """expert only: 0 = descend to pushing height once within 1 cm of the pre-push point (closing in at the current
    height from 3 cm); > 0 = descend continuously as the horizontal distance shrinks, from clearance height at
    1 cm + this far out, so a position estimate a centimetre or two off still comes down behind the cube. 0.04 cloned
    push alone to 16 % held-out at version 0 vs 0 % (BENCHMARKS.md, `push_only_funnel`)"""

    approach: str = "over"
    """expert only: "over" = move at clearance height to the pre-push point and descend there; "around" = come down
    to pushing height as soon as the tip is clear of the cube and go round it at that height to the pre-push point
    (a waypoint beside the cube when the straight path is blocked), so a cloned policy never has to decide where to
    descend"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.descent_funnel_m < 0:
            raise ValueError(f"descent_funnel_m must be >= 0 (0 = off), got {self.descent_funnel_m}")
        if self.approach not in ("over", "around"):
            raise ValueError(f"push approach must be 'over' or 'around', got {self.approach!r}")


def _unit(v: np.ndarray) -> np.ndarray:
    return v / max(float(np.linalg.norm(v)), 1e-9)


class Push(CubeToPadTask):
    name = "push"
    config_cls = PushConfig
    train_templates = ("push the {cube} cube onto the {pad} pad", "slide the {cube} block to the {pad} pad",
                       "move the {cube} cube onto the {pad} target", "shove the {cube} cube to the {pad} circle",
                       *CUBE_TO_PAD_TEMPLATES)
    heldout_templates = ("nudge the {cube} box over to the {pad} pad", "get the {cube} cube onto the {pad} disc")
    val_templates = ("drive the {cube} cube across to the {pad} pad", "scoot the {cube} block over onto the {pad} spot",
                     "sweep the {cube} cube onto the {pad} pad",
                     "bump the {cube} block along until it is on the {pad} pad",
                     "propel the {cube} cube to the {pad} pad", "shunt the {cube} block to the {pad} marker")
    reward_weights = {"tip_to_push_point_m": -1.0, "cube_to_pad_m": -2.0, "success": 10.0}
    """The approach term is the distance to the contact point *behind* the cube (seen from the pad), not to the
    cube: distance-to-cube shaping paid the policy for driving onto the cube from any side, and RL measurably
    lowered push success under it (BENCHMARKS.md, the main job)"""

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
        return {"tip_to_push_point_m": float(np.linalg.norm(scene.tip_pos - self.push_point(scene))),
                "cube_to_pad_m": self.cube_to_pad(scene), "success": float(self.is_success(scene))}

    def push_point(self, scene: Scene) -> np.ndarray:
        """Where the fingertip touches the cube to push it straight at the pad: behind its centre on the pad line,
        at pushing height."""
        cube, pad = scene.cube_pos(self.cube)[:2], scene.pad_pos(self.pad)[:2]
        return np.array([*(cube - _unit(pad - cube) * (CUBE_HALF_M + PUSH_CONTACT_GAP_M)), PUSH_Z_M])

    def is_success(self, scene: Scene) -> bool:
        return self.cube_to_pad(scene) < self.config.success_radius_m

    def expert_action(self, scene: Scene) -> np.ndarray:
        cube, pad, tip = scene.cube_pos(self.cube)[:2], scene.pad_pos(self.pad)[:2], scene.tip_pos
        direction = _unit(pad - cube)
        rel = tip[:2] - cube
        along = float(np.dot(rel, direction))
        lateral = float(rel[0] * direction[1] - rel[1] * direction[0])
        behind = -(PRE_PUSH_BACK_M + 0.02) < along < -CUBE_HALF_M + 0.005
        if tip[2] < 0.03 and behind and abs(lateral) < PUSH_LATERAL_TOL_M:
            # low behind the cube: follow a carrot 4 cm ahead on the cube-pad line (converging laterally while
            # advancing), then drive through the cube's centre; the line is re-aimed every step
            goal = cube + direction * min(along + 0.04, 0.03)
            return self.move_toward(scene, np.array([*goal, PUSH_Z_M]), grip=1.0)
        pre = cube - direction * PRE_PUSH_BACK_M
        if self.config.approach == "around":
            return self._approach_around(scene, cube, direction, pre, lateral)
        if tip[2] < CLEAR_Z_M - 0.02 and np.linalg.norm(rel) < 0.07 and not behind:
            # low and next to the cube but misaligned: lift straight up before re-approaching
            return self.move_toward(scene, np.array([tip[0], tip[1], CLEAR_Z_M]), grip=1.0)
        funnel = self.config.descent_funnel_m
        if funnel > 0:
            dist = float(np.linalg.norm(tip[:2] - pre))
            z = PUSH_Z_M + (CLEAR_Z_M - PUSH_Z_M) * float(np.clip((dist - 0.01) / funnel, 0.0, 1.0))
            return self.move_toward(scene, np.array([*pre, z]), grip=1.0)
        if np.linalg.norm(tip[:2] - pre) > 0.01:
            z = CLEAR_Z_M if np.linalg.norm(tip[:2] - pre) > 0.03 else tip[2]
            return self.move_toward(scene, np.array([*pre, z]), grip=1.0)
        return self.move_toward(scene, np.array([*pre, PUSH_Z_M]), grip=1.0)

    def _approach_around(self, scene: Scene, cube: np.ndarray, direction: np.ndarray, pre: np.ndarray,
                         lateral: float) -> np.ndarray:
        """approach="around": low, round the cube to the pre-push point. If the straight path to it passes within
        AROUND_CLEARANCE_M of the cube's centre, the goal is the waypoint furthest round (on the tip's side of the
        cube-pad line, at 45, 90 or 135 degrees from the push direction, AROUND_RADIUS_M out) that the tip can reach
        in a clear straight line; none clear: straight away from the cube. Over the cube the tip keeps its height."""
        tip = scene.tip_pos
        p = tip[:2]

        def clear(a: np.ndarray, b: np.ndarray) -> bool:
            seg = b - a
            t = float(np.clip(np.dot(cube - a, seg) / max(float(np.dot(seg, seg)), 1e-12), 0.0, 1.0))
            return float(np.linalg.norm(a + t * seg - cube)) >= AROUND_CLEARANCE_M

        goal = pre
        if not clear(p, pre):
            side = np.array([direction[1], -direction[0]]) * (1.0 if lateral >= 0 else -1.0)
            goal = cube + _unit(p - cube) * AROUND_RADIUS_M
            for ang in (3 * np.pi / 4, np.pi / 2, np.pi / 4):  # furthest round first
                w = cube + AROUND_RADIUS_M * (np.cos(ang) * direction + np.sin(ang) * side)
                if clear(p, w):
                    goal = w
                    break
        z = tip[2] if np.linalg.norm(p - cube) < AROUND_CLEARANCE_M else PUSH_Z_M
        return self.move_toward(scene, np.array([*goal, z]), grip=1.0)


AROUND_CLEARANCE_M = 0.05
"""approach="around": the fingertip's path keeps this far from the cube's centre (cube half-diagonal 2.8 cm plus the
closed fingers' half-width, 1.4 cm, plus margin)"""
AROUND_RADIUS_M = 0.08
"""approach="around": waypoints this far from the cube's centre; consecutive ones (and the last one and the pre-push
point 6 cm behind the cube) are joined by straight paths at least 5.9 cm from it"""
