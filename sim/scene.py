"""The tabletop scene: a table, a mocap-driven parallel gripper, coloured cubes, target pads and moving balls.

Every task builds its own MJCF from these parts (only the objects it needs), so a task is one file plus one
registry line. The gripper is a free body welded to a mocap target: actions move the target, the weld pulls the
gripper, contacts with objects stay physical (pushing and grasping work as in a real arm's Cartesian controller).

Rendering is software (Mesa llvmpipe through EGL) on our machines; shadows cost ~15x in frame rate, so the scene
has none (install notes: 37 fps with the default shadow map vs ~550 fps without, 64x64) and no multisampling
(measured: 186 fps with the default 4 samples vs 445 fps without at 64x64; at 64x64 the images barely differ).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")  # must precede the mujoco import; no display on our machines
import mujoco  # noqa: E402

COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.1, 0.1),
    "green": (0.1, 0.8, 0.1),
    "blue": (0.1, 0.25, 0.95),
    "yellow": (0.95, 0.85, 0.1),
    "magenta": (0.85, 0.1, 0.85),
    "cyan": (0.1, 0.85, 0.85),
}
"""named colours; cubes and balls use red/green/blue, pads use yellow/magenta/cyan so names never clash"""

TABLE_HALF_M = 0.35
"""the table top is a square of side 0.7 m centred at the origin, surface at z = 0"""
WORKSPACE_LOW = np.array([-0.25, -0.25, 0.0], dtype=np.float64)
"""gripper-tip workspace box (m); actions that would leave it are clipped by the env"""
WORKSPACE_HIGH = np.array([0.25, 0.25, 0.25], dtype=np.float64)
CUBE_HALF_M = 0.02
PAD_RADIUS_M = 0.05
BALL_RADIUS_M = 0.025
FINGER_OPEN_M = 0.035
"""finger joint travel: each finger slides from 0 (closed, touching) to this (open)"""
TIP_OFFSET_M = 0.055
"""distance from the gripper body origin down to the fingertip site"""


@dataclass(frozen=True)
class SceneSpec:
    """Which objects a task's scene contains (names are colours)."""

    cubes: tuple[str, ...] = ()
    pads: tuple[str, ...] = ()
    balls: tuple[str, ...] = ()
    timestep_s: float = 0.005
    """physics step; 20 substeps per control step at 10 Hz"""


def _rgba(color: str, alpha: float = 1.0) -> str:
    r, g, b = COLORS[color]
    return f"{r} {g} {b} {alpha}"


def build_xml(spec: SceneSpec, image_size: int) -> str:
    """MJCF text for a scene; objects are placed at reset, their XML positions are placeholders."""
    parts = []
    for i, c in enumerate(spec.cubes):
        parts.append(
            f'<body name="cube_{c}" pos="{0.1 * i} 0.5 {CUBE_HALF_M}"><freejoint name="cube_{c}"/>'
            f'<geom type="box" size="{CUBE_HALF_M} {CUBE_HALF_M} {CUBE_HALF_M}" rgba="{_rgba(c)}" mass="0.03" '
            f'friction="0.5 0.01 0.001" condim="4"/></body>')
    for i, c in enumerate(spec.pads):
        parts.append(
            f'<body name="pad_{c}" pos="{0.1 * i} -0.5 0"><geom type="cylinder" size="{PAD_RADIUS_M} 0.001" '
            f'rgba="{_rgba(c)}" contype="0" conaffinity="0"/></body>')
    for i, c in enumerate(spec.balls):
        parts.append(
            f'<body name="ball_{c}" mocap="true" pos="{0.1 * i} 0.6 {BALL_RADIUS_M}"><geom type="sphere" '
            f'size="{BALL_RADIUS_M}" rgba="{_rgba(c)}" contype="0" conaffinity="0"/></body>')
    objects = "\n    ".join(parts)
    return f"""<mujoco model="acce_tabletop">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="{spec.timestep_s}" cone="elliptic" impratio="10" integrator="implicitfast"/>
  <visual>
    <global offwidth="{max(image_size, 64)}" offheight="{max(image_size, 64)}"/>
    <quality shadowsize="0" offsamples="0"/>
    <headlight ambient="0.45 0.45 0.45" diffuse="0.5 0.5 0.5" specular="0 0 0"/>
  </visual>
  <worldbody>
    <light pos="0 -0.3 1.5" dir="0 0.2 -1" castshadow="false" diffuse="0.4 0.4 0.4"/>
    <!-- size[2] is the plane's rendering grid spacing: 0.01 m drew a 400 x 400 grid, 2.5 ms per 64 x 64 frame in
         software GL; 0.1 m draws the same image (max pixel difference 1) in 0.37 ms -->
    <geom name="floor" type="plane" pos="0 0 -0.75" size="2 2 0.1" rgba="0.25 0.25 0.28 1"/>
    <geom name="table" type="box" pos="0 0 -0.02" size="{TABLE_HALF_M} {TABLE_HALF_M} 0.02"
          rgba="0.62 0.55 0.46 1" friction="0.5 0.005 0.0001"/>
    <camera name="front" pos="0 -0.5 0.5" xyaxes="1 0 0 0 0.72 0.69" fovy="45"/>
    <camera name="top" pos="0 0 0.9" xyaxes="1 0 0 0 1 0" fovy="45"/>
    <camera name="overhead" pos="0 0 0.6" xyaxes="1 0 0 0 1 0" fovy="45"/>
    <body name="target" mocap="true" pos="0 0 0.2"/>
    <body name="gripper" pos="0 0 0.2">
      <freejoint name="gripper"/>
      <geom name="palm" type="box" size="0.025 0.05 0.012" rgba="0.15 0.15 0.15 1" mass="0.3"/>
      <geom name="wrist" type="cylinder" pos="0 0 0.04" size="0.012 0.03" rgba="0.5 0.5 0.5 1" mass="0.05"
            contype="0" conaffinity="0"/>
      <body name="finger_left" pos="0 0.008 -0.035">
        <joint name="finger_left" type="slide" axis="0 1 0" range="0 {FINGER_OPEN_M}" damping="2"/>
        <geom type="box" size="0.012 0.006 0.025" rgba="0.9 0.9 0.9 1" mass="0.02" friction="2 0.02 0.001"
              condim="4"/>
      </body>
      <body name="finger_right" pos="0 -0.008 -0.035">
        <joint name="finger_right" type="slide" axis="0 -1 0" range="0 {FINGER_OPEN_M}" damping="2"/>
        <geom type="box" size="0.012 0.006 0.025" rgba="0.9 0.9 0.9 1" mass="0.02" friction="2 0.02 0.001"
              condim="4"/>
      </body>
      <site name="tip" pos="0 0 -{TIP_OFFSET_M}" size="0.005" rgba="1 1 1 0"/>
      <!-- eye-in-hand: beside the palm across the fingers' travel, tilted 30 degrees toward them, so the gap between
           the fingers and the object under them are in view -->
      <camera name="wrist" pos="-0.06 0 0" xyaxes="0 -1 0 0.866 0 0.5" fovy="70"/>
    </body>
    {objects}
  </worldbody>
  <equality>
    <weld body1="target" body2="gripper" solref="0.02 1" solimp="0.95 0.99 0.001"/>
  </equality>
  <actuator>
    <position name="finger_left" joint="finger_left" kp="300" ctrlrange="0 {FINGER_OPEN_M}" forcerange="-20 20"/>
    <position name="finger_right" joint="finger_right" kp="300" ctrlrange="0 {FINGER_OPEN_M}" forcerange="-20 20"/>
  </actuator>
</mujoco>"""


class Scene:
    """A compiled scene with named accessors; tasks read and write object poses through it."""

    def __init__(self, spec: SceneSpec, image_size: int = 64, camera: str = "front"):
        self.spec = spec
        self.model = mujoco.MjModel.from_xml_string(build_xml(spec, image_size))
        self.data = mujoco.MjData(self.model)
        self.image_size = image_size
        self.camera = camera
        self._renderer: mujoco.Renderer | None = None
        self._tip_site = self.model.site("tip").id
        self._gripper_body = self.model.body("gripper").id
        self._target_mocap = self.model.body_mocapid[self.model.body("target").id]
        self._gripper_qpos = self.model.jnt_qposadr[self.model.joint("gripper").id]
        self._gripper_qvel = self.model.jnt_dofadr[self.model.joint("gripper").id]
        self._finger_qpos = [self.model.jnt_qposadr[self.model.joint(n).id] for n in ("finger_left", "finger_right")]

    # --- gripper ---------------------------------------------------------------------------------------------
    @property
    def tip_pos(self) -> np.ndarray:
        return self.data.site_xpos[self._tip_site].copy()

    @property
    def tip_vel(self) -> np.ndarray:
        return self.data.qvel[self._gripper_qvel:self._gripper_qvel + 3].copy()

    @property
    def tip_target(self) -> np.ndarray:
        return self.data.mocap_pos[self._target_mocap] - np.array([0.0, 0.0, TIP_OFFSET_M])

    @property
    def finger_opening(self) -> float:
        """mean finger travel in [0, 1]: 0 closed, 1 fully open"""
        return float(np.mean([self.data.qpos[a] for a in self._finger_qpos]) / FINGER_OPEN_M)

    def set_tip_target(self, pos: np.ndarray) -> None:
        self.data.mocap_pos[self._target_mocap] = np.asarray(pos) + np.array([0.0, 0.0, TIP_OFFSET_M])

    def set_finger_command(self, opening01: float) -> None:
        self.data.ctrl[:] = float(np.clip(opening01, 0.0, 1.0)) * FINGER_OPEN_M

    def place_gripper(self, tip_pos: np.ndarray, opening01: float = 1.0) -> None:
        """Teleport the gripper and its target (reset only)."""
        body_pos = np.asarray(tip_pos, dtype=np.float64) + np.array([0.0, 0.0, TIP_OFFSET_M])
        self.data.qpos[self._gripper_qpos:self._gripper_qpos + 3] = body_pos
        self.data.qpos[self._gripper_qpos + 3:self._gripper_qpos + 7] = (1.0, 0.0, 0.0, 0.0)
        self.data.qvel[self._gripper_qvel:self._gripper_qvel + 6] = 0.0
        self.data.mocap_pos[self._target_mocap] = body_pos
        for adr in self._finger_qpos:
            self.data.qpos[adr] = opening01 * FINGER_OPEN_M
        self.set_finger_command(opening01)

    # --- objects ---------------------------------------------------------------------------------------------
    def cube_pos(self, color: str) -> np.ndarray:
        return self.data.body(f"cube_{color}").xpos.copy()

    def set_cube(self, color: str, xy: np.ndarray, yaw_rad: float = 0.0) -> None:
        adr = self.model.jnt_qposadr[self.model.joint(f"cube_{color}").id]
        dof = self.model.jnt_dofadr[self.model.joint(f"cube_{color}").id]
        self.data.qpos[adr:adr + 3] = (xy[0], xy[1], CUBE_HALF_M)
        self.data.qpos[adr + 3:adr + 7] = (np.cos(yaw_rad / 2), 0.0, 0.0, np.sin(yaw_rad / 2))
        self.data.qvel[dof:dof + 6] = 0.0

    def pad_pos(self, color: str) -> np.ndarray:
        return self.model.body(f"pad_{color}").pos.copy()

    def set_pad(self, color: str, xy: np.ndarray) -> None:
        self.model.body(f"pad_{color}").pos[:] = (xy[0], xy[1], 0.0)

    def ball_pos(self, color: str) -> np.ndarray:
        return self.data.mocap_pos[self.model.body_mocapid[self.model.body(f"ball_{color}").id]].copy()

    def set_ball(self, color: str, xy: np.ndarray) -> None:
        mid = self.model.body_mocapid[self.model.body(f"ball_{color}").id]
        self.data.mocap_pos[mid] = (xy[0], xy[1], BALL_RADIUS_M)

    def set_ball_visible(self, color: str, visible: bool) -> None:
        """Show or hide a ball in the rendered images (balls never collide, so physics is unaffected). The model
        keeps it across `reset`: a task that hides balls sets every ball's visibility in its own reset."""
        body = self.model.body(f"ball_{color}").id
        self.model.geom_rgba[self.model.body_geomadr[body], 3] = 1.0 if visible else 0.0

    # --- simulation ------------------------------------------------------------------------------------------
    def reset(self) -> None:
        mujoco.mj_resetData(self.model, self.data)

    def forward(self) -> None:
        mujoco.mj_forward(self.model, self.data)

    def step(self, n_substeps: int) -> None:
        mujoco.mj_step(self.model, self.data, nstep=n_substeps)

    def render(self, camera: str | None = None) -> np.ndarray:
        """(H, W, 3) uint8 image from a named camera; the renderer is created on first use."""
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self.model, self.image_size, self.image_size)
        self._renderer.update_scene(self.data, camera=camera or self.camera)
        return self._renderer.render()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
