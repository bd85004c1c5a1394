"""LeRobotRobot: any lerobot robot, built from its own lerobot config by lerobot's own factory.

A robot file (`acce robot --robot lerobot --robot-config arm.yaml`) has three sections:

    robot:    # exactly what `lerobot-record --robot.*` takes, as a mapping (decoded by draccus into RobotConfig)
      type: so101_follower
      port: /dev/ttyACM0
      id: my_arm
      cameras: {front: {type: opencv, index_or_path: 0, width: 640, height: 480, fps: 30}}
    io:       # robot_bridge.robot.RobotIO: which keys form acce's observation and action, and how [-1, 1] maps
              # (a policy trained on this arm's LeRobotDataset needs none of it: its env spec has the keys and units)
      cameras: {front: front}
      state_keys: [shoulder_pan.pos, shoulder_lift.pos, elbow_flex.pos, wrist_flex.pos, wrist_roll.pos, gripper.pos]
      action_keys: [shoulder_pan.pos, shoulder_lift.pos, elbow_flex.pos, wrist_flex.pos, wrist_roll.pos, gripper.pos]
      action_mode: absolute
      action_low: [-100, -100, -100, -100, -100, 0]
      action_high: [100, 100, 100, 100, 100, 100]
      action_repr: joint_pos_abs
    safety:   # robot_bridge.safety.SafetyConfig fields (optional)
      max_rate: [0.1, 0.1, 0.1, 0.1, 0.1, 0.5]

lerobot is imported only here, inside functions: `import robot_bridge` stays light.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import pkgutil
from pathlib import Path
from typing import Any

from robot_bridge.robot import RobotIO

logger = logging.getLogger(__name__)


def register_lerobot_choices() -> None:
    """Import every lerobot robot and camera config module so draccus knows their `type` names (lerobot's own
    scripts do the same with explicit imports), plus third-party `lerobot_robot_*` plugins."""
    import lerobot.cameras
    import lerobot.robots
    from lerobot.utils.import_utils import register_third_party_plugins

    for mod in pkgutil.iter_modules(lerobot.robots.__path__):
        if mod.ispkg:
            _try_import(f"lerobot.robots.{mod.name}")
    for mod in pkgutil.walk_packages(lerobot.cameras.__path__, "lerobot.cameras."):
        if mod.name.rsplit(".", 1)[-1].startswith("configuration"):
            _try_import(mod.name)
    register_third_party_plugins()


def _try_import(name: str) -> None:
    try:
        importlib.import_module(name)
    except Exception as err:  # one robot's optional SDK missing must not hide all the others
        logger.debug("lerobot module %s not importable: %s", name, err)


def decode_robot_config(d: dict[str, Any]):
    """A lerobot RobotConfig from a mapping with a `type` (e.g. "so101_follower") and that robot's fields."""
    import draccus
    from lerobot.robots import RobotConfig

    if not isinstance(d, dict) or "type" not in d:
        raise ValueError("the robot section needs a lerobot robot 'type', e.g. {type: so101_follower, port: ...}")
    register_lerobot_choices()
    try:
        return draccus.decode(RobotConfig, d)
    except Exception as err:
        known = sorted(RobotConfig.get_known_choices())
        raise ValueError(f"lerobot robot config {d.get('type')!r}: {err} (known types: {known})") from None


class LeRobotRobot:
    """A lerobot `Robot` (hardware) plus the io mapping and safety limits that connect it to an acce policy."""

    episode_source = "real"

    def __init__(self, robot_config, io: RobotIO | dict[str, Any], safety: dict[str, Any] | None = None):
        """robot_config: a lerobot RobotConfig or its mapping; io: RobotIO or its mapping; safety: SafetyConfig
        fields (optional)."""
        from lerobot.robots import RobotConfig
        from lerobot.robots.utils import make_robot_from_config

        config = robot_config if isinstance(robot_config, RobotConfig) else decode_robot_config(robot_config)
        self._io_fields = dataclasses.asdict(io) if isinstance(io, RobotIO) else dict(io or {})
        # state and action keys may come from the served policy's env spec (a policy trained on this arm's dataset)
        self.io = RobotIO.from_dict(self._io_fields) if {"state_keys", "action_keys"} <= set(self._io_fields) else None
        self._safety = dict(safety or {})
        self.robot = make_robot_from_config(config)
        self.name = f"lerobot:{config.type}"
        if self.io is not None:
            self.io.check_features(self)

    @classmethod
    def from_file(cls, path: str | Path) -> "LeRobotRobot":
        """Build from a YAML or JSON robot file (see the module docstring)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no robot config file at {path}; see docs/robot.md for the format")
        text = path.read_text()
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml
            data = yaml.safe_load(text)
        if not isinstance(data, dict) or "robot" not in data or set(data) - {"robot", "io", "safety"}:
            raise ValueError(f"{path} must have a section 'robot' (and optionally 'io' and 'safety'), got "
                             f"{sorted(data) if isinstance(data, dict) else type(data).__name__}")
        return cls(data["robot"], data.get("io") or {}, data.get("safety"))

    # --- the Robot contract: delegated to the lerobot robot --------------------------------------------------
    @property
    def observation_features(self) -> dict[str, Any]:
        return self.robot.observation_features

    @property
    def action_features(self) -> dict[str, Any]:
        return self.robot.action_features

    @property
    def is_connected(self) -> bool:
        return self.robot.is_connected

    def connect(self, calibrate: bool = True) -> None:
        self.robot.connect(calibrate=calibrate)

    def get_observation(self) -> dict[str, Any]:
        return self.robot.get_observation()

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        return self.robot.send_action(action)

    def disconnect(self) -> None:
        if self.robot.is_connected:
            self.robot.disconnect()

    def __enter__(self) -> "LeRobotRobot":
        self.connect()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disconnect()

    # --- defaults for the runtime ----------------------------------------------------------------------------
    def default_io(self, image_size: int = 0, spec=None) -> RobotIO:
        """The file's io section; what it leaves out (state_keys, action_keys, units, cameras) comes from the
        policy's env spec `spec` (RobotIO.for_spec), so a dataset's arm needs only its lerobot section."""
        io = self.io
        if io is None:
            if spec is None:
                raise ValueError(f"{self.name}: the io section has no state_keys / action_keys and there is no "
                                 "policy env spec to take them from")
            fields = dict(self._io_fields)
            cameras = fields.pop("cameras", None) or {c: c for c in spec.cameras}
            base = dataclasses.asdict(RobotIO.for_spec(spec, cameras))
            io = RobotIO.from_dict({**base, **fields})
        if io.image_size or not image_size:
            return io
        return dataclasses.replace(io, image_size=image_size)

    def default_safety(self, action_repr: dict[str, Any]):
        """The file's safety section; absolute commands hold every dim (a hold must not jump to mid-range)."""
        from robot_bridge.safety import SafetyConfig
        fields = dict(self._safety)
        if self.io is None or self.io.action_mode == "absolute":  # spec-derived io: absolute in the data's units
            fields.setdefault("hold_keep_dims", list(range(int(action_repr.get("dim") or self.io.action_dim))))
        return SafetyConfig.from_dict(fields)
