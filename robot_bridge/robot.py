"""The Robot contract (lerobot's), the mapping between a robot's flat dicts and acce's arrays, and MockRobot.

`Robot` has lerobot's method names and semantics (`lerobot.robots.Robot`): flat observation and action dicts
described by `observation_features` / `action_features` (a float, or a shape tuple for images), connect /
get_observation / send_action / disconnect, usable as a context manager. Every lerobot robot satisfies it as is.

`RobotIO` turns those dicts into acce's observation (image/<camera> uint8 (N, N, 3), state float32 (S,)) and an
acce action (A,) in [-1, 1] back into the robot's action dict. It names the action representation it implements
(`action_repr`); the runtime refuses a checkpoint whose `action_repr["type"]` differs, because a representation
mismatch between training and deployment is the most common real-robot failure (openpi #454, #817, #1047).

Optional extensions the runtime uses when present (simulated robots have them, real ones do not):
`reset_episode(seed) -> instruction`, `task_status() -> {"reward", "success", "terminated", "truncated"}`,
`default_io(image_size, spec) -> RobotIO`, `default_safety(action_repr) -> SafetyConfig`, `episode_source` ("real" by
default).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from acce.images import resize_square as resize  # the same resize as a dataset import
from acce.types import IMAGE_PREFIX, STATE_KEY, EnvSpec

ACTION_MODES = ("direct", "absolute", "delta")


@runtime_checkable
class Robot(Protocol):
    """lerobot's Robot contract (connect / get_observation / send_action / disconnect, features, context manager)."""

    name: str

    @property
    def observation_features(self) -> dict[str, Any]: ...

    @property
    def action_features(self) -> dict[str, Any]: ...

    @property
    def is_connected(self) -> bool: ...

    def connect(self, calibrate: bool = True) -> None: ...

    def get_observation(self) -> dict[str, Any]: ...

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        """Command the robot; returns the action actually sent (possibly clipped by the robot)."""
        ...

    def disconnect(self) -> None: ...

    def __enter__(self) -> "Robot": ...

    def __exit__(self, *exc: Any) -> None: ...


@dataclass(frozen=True)
class RobotIO:
    """How a robot's flat observation/action dicts map to acce's observation and normalized action."""

    cameras: dict[str, str]
    """acce camera name -> robot observation key holding that camera's (h, w, 3) uint8 image"""
    state_keys: tuple[str, ...]
    """robot observation keys (floats) that form acce's state vector, in order"""
    action_keys: tuple[str, ...]
    """robot action keys, one per acce action dim, in order"""
    action_repr: str
    """name of the normalized action representation this mapping implements (the checkpoint's must match)"""
    image_size: int = 0
    """resize camera images to (image_size, image_size); 0 = they must already have the policy's size"""
    action_mode: str = "direct"
    """direct: send a as is; absolute: low + (a + 1) / 2 * (high - low); delta: present + a * scale"""
    action_low: tuple[float, ...] = ()
    """absolute mode: physical value of each action key at a = -1"""
    action_high: tuple[float, ...] = ()
    """absolute mode: physical value at a = +1"""
    action_scale: tuple[float, ...] = ()
    """delta mode: physical change of each action key at a = +1 (the present value is read from the observation
    key of the same name)"""
    extra: dict[str, Any] = field(default_factory=dict)
    """free-form notes stored with recordings (units, calibration id, ...)"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cameras", dict(self.cameras))
        for name in ("state_keys", "action_keys", "action_low", "action_high", "action_scale"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.action_mode not in ACTION_MODES:
            raise ValueError(f"action_mode {self.action_mode!r} is not one of {ACTION_MODES}")
        if not self.cameras or not self.state_keys or not self.action_keys:
            raise ValueError("RobotIO needs at least one camera, one state key and one action key")
        n = len(self.action_keys)
        if self.action_mode == "absolute" and not len(self.action_low) == len(self.action_high) == n:
            raise ValueError(f"absolute action_mode needs action_low and action_high with {n} values each")
        if self.action_mode == "delta" and len(self.action_scale) != n:
            raise ValueError(f"delta action_mode needs action_scale with {n} values")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RobotIO":
        """From JSON/YAML (lists become tuples); unknown keys are an error naming the valid ones."""
        from acce.configlib import dataclass_from_dict
        return dataclass_from_dict(cls, d, "io")

    @classmethod
    def for_spec(cls, spec: EnvSpec, cameras: dict[str, str], image_size: int = 0) -> "RobotIO":
        """The mapping a named env spec implies (a policy trained on a robot's dataset): the spec's state and action
        names are the robot's keys, and with recorded units the actions go out absolute in those units."""
        if not spec.state_names or not spec.action_names:
            raise ValueError("the policy's env spec names no state / action features (it was not trained on a "
                             "robot's dataset): give the robot file's io section state_keys and action_keys")
        units = ({"action_mode": "absolute", "action_low": spec.action_low, "action_high": spec.action_high}
                 if spec.action_low else {})
        return cls(cameras=cameras, state_keys=spec.state_names, action_keys=spec.action_names,
                   action_repr=spec.action_repr, image_size=image_size, **units)

    @property
    def state_dim(self) -> int:
        return len(self.state_keys)

    @property
    def action_dim(self) -> int:
        return len(self.action_keys)

    def check_features(self, robot: Robot) -> None:
        """Every mapped key must exist in the robot's features (fails before the robot moves)."""
        obs, act = robot.observation_features, robot.action_features
        missing = [k for k in (*self.cameras.values(), *self.state_keys) if k not in obs]
        missing += [f"action:{k}" for k in self.action_keys if k not in act]
        if self.action_mode == "delta":
            missing += [f"present:{k}" for k in self.action_keys if k not in obs]
        if missing:
            raise ValueError(f"robot {robot.name!r} has no feature(s) {missing}; it offers observations "
                             f"{sorted(obs)} and actions {sorted(act)}: fix the io mapping")

    def to_acce(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Robot observation -> {"image/<camera>": uint8 (N, N, 3), "state": float32 (S,)}."""
        out: dict[str, Any] = {}
        for cam, key in self.cameras.items():
            img = np.asarray(raw[key])
            if img.ndim != 3 or img.shape[2] != 3:
                raise ValueError(f"camera {key!r} gave an image of shape {img.shape}, expected (h, w, 3)")
            out[IMAGE_PREFIX + cam] = resize(img, self.image_size) if self.image_size else img.astype(np.uint8)
        out[STATE_KEY] = np.asarray([float(raw[k]) for k in self.state_keys], np.float32)
        return out

    def to_robot(self, action: np.ndarray, raw: dict[str, Any]) -> dict[str, float]:
        """acce action (A,) in [-1, 1] -> robot action dict (raw: this step's observation, for delta mode)."""
        a = np.asarray(action, np.float64).reshape(-1)
        if self.action_mode == "absolute":
            lo, hi = np.asarray(self.action_low), np.asarray(self.action_high)
            a = lo + (a + 1.0) / 2.0 * (hi - lo)
        elif self.action_mode == "delta":
            a = np.asarray([float(raw[k]) for k in self.action_keys]) + a * np.asarray(self.action_scale)
        return {k: float(v) for k, v in zip(self.action_keys, a)}

    def present_action(self, raw: dict[str, Any]) -> np.ndarray | None:
        """Absolute mode: the normalized action that commands where the robot is now (read from observation keys
        named like the action keys), so rate limits and holds start from the real pose; None otherwise."""
        if self.action_mode != "absolute" or not all(k in raw for k in self.action_keys):
            return None
        lo, hi = np.asarray(self.action_low), np.asarray(self.action_high)
        present = np.asarray([float(raw[k]) for k in self.action_keys])
        return np.clip(2.0 * (present - lo) / (hi - lo) - 1.0, -1.0, 1.0).astype(np.float32)


class MockRobot:
    """A robot without hardware, for unit tests: random images, a state that integrates the commanded deltas,
    and a log of every action it was sent (with monotonic timestamps). Features are named s<i> / a<i> and one camera
    unless names and cameras are given (a mock of a named arm: `from_spec` of a dataset's spec)."""

    name = "mock"
    episode_source = "real"

    def __init__(self, *, state_dim: int, action_dim: int, image_size: int = 32, camera: str = "front",
                 seed: int = 0, cameras: tuple[str, ...] = (), state_names: tuple[str, ...] = (),
                 action_names: tuple[str, ...] = ()):
        self.state_dim, self.action_dim, self.image_size, self.camera = state_dim, action_dim, image_size, camera
        self.cameras = tuple(cameras) or (camera,)
        self.state_names = tuple(state_names) or tuple(f"s{i}" for i in range(state_dim))
        self.action_names = tuple(action_names) or tuple(f"a{i}" for i in range(action_dim))
        if len(self.state_names) != state_dim or len(self.action_names) != action_dim:
            raise ValueError(f"MockRobot: {len(self.state_names)} state / {len(self.action_names)} action names for "
                             f"{state_dim} / {action_dim} dims")
        self._rng = np.random.default_rng(seed)
        self._connected = False
        self.state = np.zeros(state_dim, np.float64)
        self.sent: list[tuple[float, dict[str, float]]] = []
        """(monotonic time, action dict) of every send_action"""

    @classmethod
    def from_spec(cls, spec: EnvSpec, seed: int = 0) -> "MockRobot":
        """A mock with the widths, image size, cameras and dim names of a policy's env spec."""
        return cls(state_dim=spec.state_dim, action_dim=spec.action_dim, image_size=spec.image_size,
                   camera=spec.cameras[0], seed=seed, cameras=spec.cameras if spec.action_names else (),
                   state_names=spec.state_names, action_names=spec.action_names)

    @property
    def observation_features(self) -> dict[str, Any]:
        feats: dict[str, Any] = {c: (self.image_size, self.image_size, 3) for c in self.cameras}
        feats.update({n: float for n in self.state_names})
        return feats

    @property
    def action_features(self) -> dict[str, Any]:
        return {n: float for n in self.action_names}

    @property
    def is_connected(self) -> bool:
        return self._connected

    @property
    def is_calibrated(self) -> bool:
        return True

    def connect(self, calibrate: bool = True) -> None:
        self._connected = True

    def calibrate(self) -> None:
        pass

    def configure(self) -> None:
        pass

    def _check(self) -> None:
        if not self._connected:
            raise ConnectionError("MockRobot is not connected; call connect() first")

    def get_observation(self) -> dict[str, Any]:
        self._check()
        obs: dict[str, Any] = {c: self._rng.integers(0, 256, (self.image_size, self.image_size, 3), np.uint8)
                               for c in self.cameras}
        obs.update({n: float(v) for n, v in zip(self.state_names, self.state)})
        return obs

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        import time
        self._check()
        a = np.asarray([float(action[n]) for n in self.action_names])
        n = min(3, self.state_dim, self.action_dim)
        self.state[:n] += 0.01 * a[:n]
        self.sent.append((time.monotonic(), dict(action)))
        return dict(action)

    def disconnect(self) -> None:
        self._connected = False

    def __enter__(self) -> "MockRobot":
        self.connect()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disconnect()

    def default_io(self, image_size: int = 0, spec: EnvSpec | None = None) -> RobotIO:
        """s<i> / a<i> for any policy; a named mock maps its names, in the data's units when the spec has them."""
        if self.action_names[0] == "a0" and self.state_names[0] == "s0":
            return RobotIO(cameras={"front": self.camera}, state_keys=self.state_names,
                           action_keys=self.action_names, action_repr="any", image_size=image_size)
        return RobotIO.for_spec(spec, {c: c for c in self.cameras}, image_size) if spec is not None else RobotIO(
            cameras={c: c for c in self.cameras}, state_keys=self.state_names, action_keys=self.action_names,
            action_repr="any", image_size=image_size)
