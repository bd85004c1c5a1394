"""SimRobot: a sim/ tabletop task behind the Robot contract, running in real time, to rehearse a deployment.

Real time means the world does not wait for the controller: `send_action` runs one control step of physics, and
a background clock thread runs a *hold* step (no fingertip motion, gripper unchanged) whenever the controller has
not sent an action for 1.5 control periods, as a real arm would keep standing while nobody commands it (and a
moving target would keep moving). Rendering only happens in `connect` and `get_observation`, which must be called
from the same thread: MuJoCo's offscreen GL context belongs to the thread that created it.

The flat dicts follow lerobot's style: observation {"front": (N, N, 3) uint8, "tip.x", "tip.y", "tip.z",
"tip_vel.x", "tip_vel.y", "tip_vel.z", "finger.opening"}; action {"tip.dx", "tip.dy", "tip.dz", "gripper"} in
[-1, 1] (the env's own action, i.e. the "delta_xyz_gripper" representation acce checkpoints are trained in).
"""
from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from robot_bridge.robot import RobotIO

STATE_KEYS = ("tip.x", "tip.y", "tip.z", "tip_vel.x", "tip_vel.y", "tip_vel.z", "finger.opening")
"""the env's 7-d proprioception (sim.env.STATE_DIM) under lerobot-style names"""
ACTION_KEYS = ("tip.dx", "tip.dy", "tip.dz", "gripper")
GRIPPER_DIM = 3
ACTION_REPR = "delta_xyz_gripper"


class SimRobot:
    """One TabletopEnv stepped in real time. Episodic extensions: `reset_episode`, `task_status`."""

    name = "sim"
    episode_source = "sim"
    """rehearsal episodes are simulated: recorded as source "sim" so they never pass for real-robot data"""

    def __init__(self, task: str = "reach", *, image_size: int = 64, cameras: tuple[str, ...] = ("front",),
                 task_params: dict[str, Any] | None = None, instruction_split: str = "train",
                 control_hz: float | None = None):
        """control_hz, when given, must equal the task's (a check, not a setting: the task defines the rate)."""
        self.task, self.image_size, self.cameras = task, int(image_size), tuple(cameras)
        self.task_params, self.instruction_split = dict(task_params or {}), instruction_split
        self._control_hz = control_hz
        self.env = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._episode_live = False
        self._last_step_s = 0.0
        self._last_gripper = -1.0
        self._status = {"reward": 0.0, "success": False, "terminated": False, "truncated": False}
        self.hold_steps = 0
        """physics steps the clock thread ran because no action came in time (all episodes)"""

    # --- features --------------------------------------------------------------------------------------------
    @property
    def observation_features(self) -> dict[str, Any]:
        feats: dict[str, Any] = {c: (self.image_size, self.image_size, 3) for c in self.cameras}
        feats.update({k: float for k in STATE_KEYS})
        return feats

    @property
    def action_features(self) -> dict[str, Any]:
        return {k: float for k in ACTION_KEYS}

    @property
    def control_hz(self) -> float:
        """the task's own rate (its config, with the trained task_params applied)"""
        if self.env is not None:
            return float(self.env.control_hz)
        from sim.vector_env import task_config_from_params
        return float(task_config_from_params(self.task, self.task_params).control_hz)

    # --- connection ------------------------------------------------------------------------------------------
    @property
    def is_connected(self) -> bool:
        return self.env is not None

    @property
    def is_calibrated(self) -> bool:
        return True

    def calibrate(self) -> None:
        pass

    def configure(self) -> None:
        pass

    def connect(self, calibrate: bool = True) -> None:
        from sim.env import TabletopEnv
        from sim.vector_env import task_config_from_params

        if self.env is not None:
            return
        config = task_config_from_params(self.task, self.task_params) if self.task_params else None
        self.env = TabletopEnv(self.task, image_size=self.image_size, cameras=self.cameras,
                               instruction_split=self.instruction_split, task_config=config)
        if self._control_hz is not None and abs(self._control_hz - self.env.control_hz) > 1e-9:
            raise ValueError(f"task {self.task!r} runs at {self.env.control_hz} Hz, not {self._control_hz} Hz")
        self.env.reset(seed=0)
        # Render once now: creating the offscreen GL context takes ~0.2 s, which would otherwise land in the first
        # control step and in the first latency sample (and from there in a training run's latency model).
        self.env.observe()
        self._stop.clear()
        self._thread = threading.Thread(target=self._clock, name="sim-robot-clock", daemon=True)
        self._thread.start()

    def disconnect(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        with self._lock:
            if self.env is not None:
                self.env.close()
                self.env = None

    def __enter__(self) -> "SimRobot":
        self.connect()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disconnect()

    def _check(self) -> None:
        if self.env is None:
            raise ConnectionError("SimRobot is not connected; call connect() first")

    # --- episodes --------------------------------------------------------------------------------------------
    def reset_episode(self, seed: int) -> str:
        """New layout from `seed` (same seed, same layout and instruction as in-sim evaluation); returns the
        instruction."""
        self._check()
        with self._lock:
            self.env.reset(seed=int(seed))
            self._status = {"reward": 0.0, "success": False, "terminated": False, "truncated": False}
            self._last_gripper = -1.0
            self._last_step_s = time.monotonic()
            self._episode_live = True
            return self.env.instruction

    def task_status(self) -> dict[str, Any]:
        """Reward summed and success OR-ed over the physics steps since the last call; terminated/truncated."""
        with self._lock:
            status = dict(self._status)
            self._status["reward"], self._status["success"] = 0.0, False
            return status

    # --- the Robot contract ----------------------------------------------------------------------------------
    def get_observation(self) -> dict[str, Any]:
        self._check()
        with self._lock:
            obs = self.env.observe()
        out: dict[str, Any] = {c: obs[f"image/{c}"] for c in self.cameras}
        out.update({k: float(v) for k, v in zip(STATE_KEYS, obs["state"])})
        return out

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        self._check()
        a = np.asarray([float(action[k]) for k in ACTION_KEYS], np.float32)
        with self._lock:
            self._physics_step(a)
        return {k: float(v) for k, v in zip(ACTION_KEYS, a)}

    def _physics_step(self, a: np.ndarray) -> None:
        """One control step (lock held). After the episode ended the arm just stands: nothing is stepped."""
        if not self._episode_live:
            return
        reward, terminated, truncated, info = self.env.step_no_render(a)
        self._last_step_s = time.monotonic()
        self._last_gripper = float(a[GRIPPER_DIM])
        s = self._status
        s["reward"] += float(reward)
        s["success"] |= bool(info["success"])
        s["terminated"] |= bool(terminated)
        s["truncated"] |= bool(truncated)
        if terminated or truncated:
            self._episode_live = False

    def _clock(self) -> None:
        while not self._stop.wait(0.25 / self.control_hz):
            with self._lock:
                if self.env is None or not self._episode_live:
                    continue
                if time.monotonic() - self._last_step_s > 1.5 / self.control_hz:
                    hold = np.zeros(len(ACTION_KEYS), np.float32)
                    hold[GRIPPER_DIM] = self._last_gripper
                    self._physics_step(hold)
                    self.hold_steps += 1

    # --- defaults for the runtime ----------------------------------------------------------------------------
    def default_io(self, image_size: int = 0, spec=None) -> RobotIO:
        return RobotIO(cameras={c: c for c in self.cameras}, state_keys=STATE_KEYS, action_keys=ACTION_KEYS,
                       action_repr=ACTION_REPR, image_size=image_size)

    def default_safety(self, action_repr: dict[str, Any]):
        """Bounds [-1, 1], the scene's own workspace box, gripper kept while holding."""
        from robot_bridge.safety import SafetyConfig
        from sim.scene import WORKSPACE_HIGH, WORKSPACE_LOW
        return SafetyConfig(hold_keep_dims=(GRIPPER_DIM,), workspace_low=tuple(float(v) for v in WORKSPACE_LOW),
                            workspace_high=tuple(float(v) for v in WORKSPACE_HIGH),
                            max_step_m=float(action_repr.get("max_step_m") or self._task_max_step_m()))

    def _task_max_step_m(self) -> float:
        """the task's own action scale, for a policy whose action description does not state it"""
        from sim.vector_env import task_config_from_params
        return float(task_config_from_params(self.task, self.task_params).max_step_m)
