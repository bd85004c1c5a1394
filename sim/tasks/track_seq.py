"""track_seq — "touch the red, then the blue, then the green ball": three moving balls, touched in turn.

The long dynamic task: latency acts through every decision of an episode, not only the first chunk as in `track`
(whose episodes last about 7 control steps). One ball is on the table at a time and orbits the table centre
counter-clockwise at `ball_speed_mps`, as in `track`, so where it will be follows from where it is (one image). Once
it is touched it vanishes and the next ball of the instruction's order appears across the table from the fingertip
(at least its orbit radius away), so every touch starts a new reaction to a newly seen, moving target. Success is
all three touched within the time limit; the reward pays for closing in on the current ball and for each touch.

Why it suits the latency bench (measured, 100 test seeds): the scripted expert executing each action d control steps
after it computed it succeeds 100 / 92 / 62 / 45 % at d = 0 / 4 / 6 / 8 here, against 100 / 96 / 93 / 76 % on
`track`, whose episodes end before stale actions add up.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.scene import Scene, SceneSpec
from sim.tasks.track import Track, TrackConfig

BALLS = ("red", "green", "blue")
"""the balls, touched in a per-episode random order that the instruction names"""


@dataclass(frozen=True)
class TrackSeqConfig(TrackConfig):
    max_steps: int = 150
    """time limit in control steps (15 s at 10 Hz; the scripted expert needs about 22)"""


class TrackSeq(Track):
    """Track's orbit dynamics and intercepting expert, aimed at `self.target`: the ball to touch now."""

    name = "track_seq"
    config_cls = TrackSeqConfig
    train_templates = ("touch the {first}, then the {second}, then the {third} ball",
                       "touch the {first}, {second} and {third} balls in turn",
                       "catch the moving balls in order, {first} first, then {second}, then {third}",
                       "reach the {first} ball, next the {second} one, last the {third} one")
    heldout_templates = ("tap the rolling {first}, {second} and {third} balls one after another",
                         "intercept the {first} ball, then the {second}, and finally the {third}")
    val_templates = ("chase the {first} ball, after it the {second}, then the {third}",
                     "get to the {first}, the {second} and the {third} sphere, in that order")
    reward_weights = {"distance_m": -1.0, "touch": 2.0, "success": 5.0}

    def scene_spec(self) -> SceneSpec:
        return SceneSpec(balls=BALLS)

    def reset(self, scene: Scene, rng: np.random.Generator) -> dict[str, str]:
        self.order = tuple(str(c) for c in rng.permutation(BALLS))
        self.radius = {c: float(rng.uniform(0.08, 0.2)) for c in self.order}
        # where each ball appears on its orbit: this far (rad) from the point opposite the fingertip
        self.offset_rad = {c: float(rng.uniform(-np.pi / 2, np.pi / 2)) for c in self.order}
        self.phase: dict[str, float] = {}
        self.touched = 0
        self.just_touched = False
        start = np.array([*rng.uniform(-0.2, 0.2, size=2), rng.uniform(0.08, 0.14)])
        scene.place_gripper(start, opening01=0.0)
        for c in BALLS:
            scene.set_ball_visible(c, False)
        self._appear(scene, self.order[0], start[:2])
        return dict(zip(("first", "second", "third"), self.order))

    def _appear(self, scene: Scene, color: str, tip_xy: np.ndarray) -> None:
        """Put `color` on its orbit across the table from the fingertip and make it the target. Opposite the tip
        within +-90 degrees, a ball at radius r is at least r (>= 8 cm) from it: every touch needs a real reach."""
        self.target = color
        self.phase[color] = float(np.arctan2(-tip_xy[1], -tip_xy[0])) + self.offset_rad[color]
        scene.set_ball(color, self._ball_xy(color, 0.0))
        scene.set_ball_visible(color, True)

    def advance(self, scene: Scene, dt_s: float) -> None:
        self.phase[self.target] += self.config.ball_speed_mps * dt_s / self.radius[self.target]
        scene.set_ball(self.target, self._ball_xy(self.target, 0.0))

    def after_physics(self, scene: Scene) -> None:
        self.just_touched = self.touched < len(self.order) and self._distance(scene) < self.config.touch_radius_m
        if not self.just_touched:
            return
        self.touched += 1
        if self.touched < len(self.order):  # the last ball stays: the episode ends on it
            scene.set_ball_visible(self.target, False)
            self._appear(scene, self.order[self.touched], scene.tip_pos[:2])

    def reward_terms(self, scene: Scene) -> dict[str, float]:
        return {"distance_m": self._distance(scene), "touch": float(self.just_touched),
                "success": float(self.is_success(scene))}

    def is_success(self, scene: Scene) -> bool:
        return self.touched == len(self.order)
