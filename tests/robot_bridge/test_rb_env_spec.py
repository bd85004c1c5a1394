"""The env spec across the bridge: acce serve advertises the checkpoint's, the robot runtime runs on it and refuses
a server that does not send one, and a hot reload with another spec is refused naming the fields."""
import pytest

from acce.types import EnvSpec
from robot_bridge.robot import MockRobot
from robot_bridge.runtime import RobotRuntime, RuntimeConfig


def test_metadata_advertises_the_checkpoints_spec(host):
    meta = host.metadata()
    spec = EnvSpec.from_dict(meta["env_spec"])
    assert spec == host.env_spec == EnvSpec(7, 4, "delta_xyz_gripper", 10.0, ("front",), 32, 0.03)
    assert (meta["state_dim"], meta["action_dim"], meta["control_hz"], meta["image_size"]) == (7, 4, 10.0, 32)


def test_runtime_refuses_a_server_without_a_spec(host):
    class OldServer:
        metadata = {k: v for k, v in host.metadata().items() if k != "env_spec"}

    with pytest.raises(ValueError, match="metadata has no env_spec") as err:
        RobotRuntime(MockRobot(state_dim=7, action_dim=4), OldServer(), RuntimeConfig(max_steps=5, instruction="x"))
    assert "\n" not in str(err.value)


def test_reload_with_another_spec_is_refused(tmp_path, write_ckpt):
    from robot_bridge.host import PolicyHost
    path = write_ckpt(tmp_path / "latest.pt", version=3)
    host = PolicyHost(path)
    try:
        write_ckpt(path, version=5, overrides=["env.image_size=48"])  # same network, other images
        message = host.reload_if_newer()
        assert "image_size: served 32, new 48" in message and host.stats["reload_refused"] == 1
    finally:
        host.close()
