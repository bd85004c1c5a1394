"""LeRobotRobot: built through lerobot's own config decoding and `make_robot_from_config`, with a registered fake
arm standing in for hardware; the real-arm check is marked `robot` (needs ACCE_ROBOT_CONFIG and the arm)."""
import json
import os
import time
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("lerobot")

from lerobot.robots import Robot, RobotConfig  # noqa: E402

from robot_bridge.lerobot_robot import LeRobotRobot, decode_robot_config  # noqa: E402
from robot_bridge.robot import RobotIO  # noqa: E402
from robot_bridge.runtime import RobotRuntime, RuntimeConfig  # noqa: E402

JOINTS = ("shoulder.pos", "elbow.pos", "gripper.pos")


@RobotConfig.register_subclass("acce_fake_arm")
@dataclass
class FakeArmConfig(RobotConfig):
    image_hw: tuple[int, int] = (48, 64)


class FakeArm(Robot):
    """A lerobot Robot without hardware: joints jump to their goal, a camera returns a gradient image."""

    config_class = FakeArmConfig
    name = "acce_fake_arm"

    def __init__(self, config: FakeArmConfig):
        super().__init__(config)
        self.config, self._connected = config, False
        self.pos = {k: 10.0 for k in JOINTS}
        self.sent: list[tuple[float, dict]] = []

    @property
    def observation_features(self):
        return {**{k: float for k in JOINTS}, "front": (*self.config.image_hw, 3)}

    @property
    def action_features(self):
        return {k: float for k in JOINTS}

    @property
    def is_connected(self):
        return self._connected

    def connect(self, calibrate=True):
        self._connected = True

    @property
    def is_calibrated(self):
        return True

    def calibrate(self):
        pass

    def configure(self):
        pass

    def get_observation(self):
        h, w = self.config.image_hw
        img = np.broadcast_to(np.linspace(0, 255, w, dtype=np.uint8)[None, :, None], (h, w, 3)).copy()
        return {**self.pos, "front": img}

    def send_action(self, action):
        self.sent.append((time.monotonic(), dict(action)))
        self.pos.update(action)
        return dict(action)

    def disconnect(self):
        self._connected = False


IO = {"cameras": {"front": "front"}, "state_keys": list(JOINTS), "action_keys": list(JOINTS),
      "action_mode": "absolute", "action_low": [-90.0, -90.0, 0.0], "action_high": [90.0, 90.0, 100.0],
      "action_repr": "joint_pos_abs"}


def _robot_file(tmp_path, **changes):
    data = {"robot": {"type": "acce_fake_arm", "id": "test", "calibration_dir": str(tmp_path / "calib")},
            "io": {**IO, **changes}, "safety": {"max_rate": [0.5, 0.5, 2.0]}}
    path = tmp_path / "arm.json"
    path.write_text(json.dumps(data))
    return path


def test_builds_through_lerobots_factory_and_maps_actions(tmp_path):
    robot = LeRobotRobot.from_file(_robot_file(tmp_path))
    assert isinstance(robot.robot, FakeArm) and robot.name == "lerobot:acce_fake_arm"
    io = robot.default_io(image_size=8)
    with robot:
        raw = robot.get_observation()
        obs = io.to_acce(raw)
    assert obs["image/front"].shape == (8, 8, 3) and obs["image/front"].dtype == np.uint8  # resized from 48x64
    np.testing.assert_array_equal(obs["state"], [10.0, 10.0, 10.0])
    # absolute: low + (a + 1) / 2 * (high - low): a=-1 -> -90, a=0 -> 0 (mid of [-90, 90]), a=1 -> 100
    assert io.to_robot(np.array([-1.0, 0.0, 1.0]), raw) == {"shoulder.pos": -90.0, "elbow.pos": 0.0,
                                                            "gripper.pos": 100.0}
    # where the arm is now, in normalized units: (10 + 90) / 180 * 2 - 1 = 0.111..., 10 / 100 * 2 - 1 = -0.8
    np.testing.assert_allclose(io.present_action(raw), [1 / 9, 1 / 9, -0.8], atol=1e-6)
    safety = robot.default_safety({})
    assert safety.max_rate == (0.5, 0.5, 2.0) and safety.hold_keep_dims == (0, 1, 2)


def test_delta_mode_and_feature_check(tmp_path):
    io = RobotIO.from_dict({**IO, "action_mode": "delta", "action_scale": [5.0, 5.0, 10.0]})
    assert io.to_robot(np.array([1.0, -0.5, 0.0]), {k: 10.0 for k in JOINTS}) == {
        "shoulder.pos": 15.0, "elbow.pos": 7.5, "gripper.pos": 10.0}
    with pytest.raises(ValueError, match="wrist.pos"):
        LeRobotRobot.from_file(_robot_file(tmp_path, state_keys=["wrist.pos", "elbow.pos", "gripper.pos"]))
    with pytest.raises(ValueError, match="known types"):
        decode_robot_config({"type": "no_such_arm"})


def test_lerobot_arm_under_the_runtime_is_only_commanded_when_a_chunk_runs(tmp_path):
    class Policy:
        metadata = {"chunk_len": 8, "action_dim": 3, "state_dim": 3, "max_delay_steps": 2, "image_size": 8,
                    "cameras": ["front"], "execution_horizon": 4, "control_hz": 50.0, "policy_version": 2,
                    "action_repr": {"type": "joint_pos_abs", "control_hz": 50.0},
                    "env_spec": {"state_dim": 3, "action_dim": 3, "action_repr": "joint_pos_abs", "control_hz": 50.0,
                                 "cameras": ["front"], "image_size": 8, "max_step_m": 0.0}}

        def infer(self, obs):
            time.sleep(0.05)  # ~3 control steps at 50 Hz
            return {"actions": np.tile([[0.2, 0.2, 0.2]], (8, 1)).astype(np.float32), "policy_version": 2}

    robot = LeRobotRobot.from_file(_robot_file(tmp_path))
    with robot:
        summary = RobotRuntime(robot, Policy(), RuntimeConfig(max_steps=15, instruction="wave")).run()
    sent = robot.robot.sent
    assert summary["episodes"] == 1 and 0 < len(sent) < 15  # holds before the first reply send nothing
    # rate limit 0.5 per step from the present pose (0.111): the first command goes to 0.2 at most
    first = sent[0][1]
    assert abs(first["shoulder.pos"] - (-90 + (0.2 + 1) / 2 * 180)) < 1e-6  # 0.2 -> 18 degrees
    assert all(-90 <= a["shoulder.pos"] <= 90 and 0 <= a["gripper.pos"] <= 100 for _, a in sent)


def test_so100_config_decodes_without_hardware():
    config = decode_robot_config({"type": "so100_follower", "port": "/dev/ttyACM0", "id": "arm"})
    assert config.type == "so100_follower" and config.port == "/dev/ttyACM0"


@pytest.mark.robot
def test_real_lerobot_arm_reads_observations():  # pragma: no cover - needs the arm
    path = os.environ.get("ACCE_ROBOT_CONFIG")
    if not path:
        pytest.skip("set ACCE_ROBOT_CONFIG to a robot file (docs/robot.md) with the arm connected")
    robot = LeRobotRobot.from_file(path)
    with robot:
        obs = robot.default_io().to_acce(robot.get_observation())
    assert np.all(np.isfinite(obs["state"]))
