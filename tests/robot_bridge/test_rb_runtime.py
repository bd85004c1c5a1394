"""The control loop with a MockRobot and an in-process fake policy: timing, recording, latency file, watchdog,
and the compatibility checks that run before the robot moves."""
import json
import threading
import time

import numpy as np
import pytest

from acce.types import EnvSpec
from robot_bridge.recording import write_latency_file
from robot_bridge.robot import MockRobot
from robot_bridge.runtime import RobotRuntime, RuntimeConfig
from robot_bridge.safety import SafetyConfig

HZ = 50.0


def with_spec(meta):
    """Metadata as acce serve sends it: the flat keys plus the env spec they describe."""
    repr_ = meta["action_repr"]
    spec = EnvSpec(meta["state_dim"], meta["action_dim"], repr_["type"], meta["control_hz"], tuple(meta["cameras"]),
                   meta["image_size"], repr_.get("max_step_m", 0.0))
    return {**meta, "env_spec": spec.to_dict()}


META = with_spec({"chunk_len": 8, "action_dim": 4, "state_dim": 7, "max_delay_steps": 4, "image_size": 8,
                  "cameras": ["front"], "execution_horizon": 4, "control_hz": HZ, "policy_version": 1,
                  "action_repr": {"type": "delta_xyz_gripper", "dim": 4, "max_step_m": 0.03, "control_hz": HZ}})
SPEC = EnvSpec.from_dict(META["env_spec"])
CHUNK = np.tile(np.array([[0.1, -0.1, 0.05, 1.0]], np.float32), (8, 1))


class FakePolicy:
    """Replies CHUNK after `latency_s`; after `hang_after` replies it blocks until released (a hung server)."""

    def __init__(self, latency_s=0.03, hang_after=None):
        self.metadata, self.latency_s, self.hang_after = dict(META), latency_s, hang_after
        self.calls, self.release = 0, threading.Event()
        self.last_reply_s = None

    def infer(self, obs):
        assert obs["image/front"].shape == (8, 8, 3) and obs["state"].shape == (7,) and obs["prefix"].shape == (4, 4)
        self.calls += 1
        if self.hang_after is not None and self.calls > self.hang_after:
            self.release.wait(10)
            raise ConnectionError("server gone")
        time.sleep(self.latency_s)
        self.last_reply_s = time.monotonic()
        return {"actions": CHUNK.copy(), "policy_version": 1}


def test_mock_run_records_episodes_and_latency(tmp_path):
    from acce.store.episodes import EpisodeStore
    from sim.latency import EmpiricalLatency

    robot, policy = MockRobot.from_spec(SPEC), FakePolicy(latency_s=0.03)
    cfg = RuntimeConfig(episodes=2, max_steps=25, instruction="wave", out_dir=str(tmp_path))
    with robot:
        summary = RobotRuntime(robot, policy, cfg).run()
    assert summary["episodes"] == 2 and summary["stop_reasons"] == ["max_steps", "max_steps"]
    assert len(robot.sent) == 50 and summary["executor_counts"]["request_errors"] == 0
    store = EpisodeStore.open(tmp_path / "episodes.zarr")
    ep = store[1]
    assert len(store) == 2 and ep.num_steps == 25 and ep.source == "real" and ep.task == "real" and ep.task_id == -1
    assert ep.instruction == "wave" and ep.truncated[-1] and not ep.terminated.any()
    assert not ep.policy_sampled[0] and ep.behavior_version[0] == -1  # nothing to execute yet: a hold
    ran = ep.policy_sampled
    assert ran.sum() >= 15 and np.all(ep.behavior_version[ran] == 1) and np.all(ep.delay_steps[ran] >= 2)
    np.testing.assert_allclose(ep.action[ran], np.broadcast_to(CHUNK[0], (int(ran.sum()), 4)))
    period = np.diff(ep.timestamp_s[:-1])
    assert abs(float(np.median(period)) - 1 / HZ) < 0.005  # the fixed-rate grid
    lines = [json.loads(x) for x in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert [x["episode_index"] for x in lines] == [0, 1] and lines[1]["requests"][0]["latency_s"] >= 0.03
    assert lines[0]["safety_counts"]["hold"] >= 1 and any(e["kind"] == "hold" for e in lines[0]["events"])
    model = EmpiricalLatency.from_file(tmp_path / "latency.json", control_hz=HZ, seed=0)
    counts = summary["executor_counts"]  # replies that arrived after their episode ended were measured too
    assert model.latencies_s.size == counts["replies"] + counts["dropped_replies"]
    assert 0.03 <= float(np.median(model.latencies_s)) < 0.2 and model.sample_steps() >= 2


def test_latency_file_round_trip(tmp_path):
    from sim.latency import EmpiricalLatency
    path = write_latency_file(tmp_path / "lat.json", [0.05, 0.101, 0.3], control_hz=10.0, delay_steps=[1, 2, 3],
                              robot="mock")
    data = json.loads(path.read_text())
    assert data["latency_s"] == [0.05, 0.101, 0.3] and data["n"] == 3 and data["source"] == "robot_bridge"
    model = EmpiricalLatency.from_file(path, control_hz=10.0, seed=1)
    assert sorted({model.sample_steps() for _ in range(200)}) == [1, 2, 3]  # ceil(latency * 10)
    with pytest.raises(ValueError):
        write_latency_file(tmp_path / "bad.json", [float("nan")], control_hz=10.0)


def test_watchdog_holds_then_stops_when_the_policy_hangs():
    robot, policy = MockRobot.from_spec(SPEC), FakePolicy(latency_s=0.01, hang_after=3)
    safety = SafetyConfig(timeout_s=0.25)
    cfg = RuntimeConfig(max_steps=500, instruction="wave", abort_after_s=0.4)
    try:
        with robot:
            t0 = time.monotonic()
            summary = RobotRuntime(robot, policy, cfg, safety=safety).run()
            elapsed = time.monotonic() - t0
    finally:
        policy.release.set()
    assert summary["stop_reasons"] == ["watchdog"] and summary["safety_counts"]["watchdog"] >= 1
    assert elapsed < 3.0
    moving = [(ts, a) for ts, a in robot.sent if any(abs(v) > 0 for v in a.values())]
    last_move = moving[-1][0]
    # motion stops within timeout_s (+ one control period) of the last reply; everything after is a hold
    assert last_move - policy.last_reply_s <= safety.timeout_s + 1.5 / HZ
    assert all(all(v == 0.0 for v in a.values()) for ts, a in robot.sent if ts > last_move)
    assert robot.sent[-1][0] - last_move >= cfg.abort_after_s - 1.5 / HZ  # held, then stopped


def test_estop_latches_and_ends_the_run():
    robot, policy = MockRobot.from_spec(SPEC), FakePolicy(latency_s=0.01)
    runtime = RobotRuntime(robot, policy, RuntimeConfig(episodes=3, max_steps=200, instruction="wave"))
    threading.Timer(0.3, runtime.estop, args=("test button",)).start()
    with robot:
        summary = runtime.run()
    assert summary["stop_reasons"] == ["estop"] and summary["episodes"] == 1
    assert all(v == 0.0 for v in robot.sent[-1][1].values())


@pytest.mark.parametrize("change, match", [
    ({"action_repr": {"type": "joint_pos_abs"}}, "action representation"),
    ({"state_dim": 6}, "state 7 / action 4"),
    ({"cameras": ["wrist"]}, "cameras"),
    ({"chunk_len": 6}, "must cover")])
def test_policy_robot_mismatch_is_refused_before_moving(change, match):
    from robot_bridge.sim_robot import SimRobot
    policy = FakePolicy()
    policy.metadata = with_spec({**META, "control_hz": 10.0, **change})
    with pytest.raises(ValueError, match=match):
        RobotRuntime(SimRobot("reach", image_size=8), policy, RuntimeConfig())


def test_runtime_config_errors_name_the_fix():
    robot = MockRobot.from_spec(SPEC)
    with pytest.raises(ValueError, match="--max-steps"):
        RobotRuntime(robot, FakePolicy(), RuntimeConfig(instruction="x"))
    with pytest.raises(ValueError, match="--instruction"):
        RobotRuntime(robot, FakePolicy(), RuntimeConfig(max_steps=5))
    with pytest.raises(ValueError, match="trained at 50.0 Hz"):
        RobotRuntime(robot, FakePolicy(), RuntimeConfig(max_steps=5, instruction="x", control_hz=10.0))
    with pytest.raises(ValueError, match="watchdog fires"):
        RobotRuntime(robot, FakePolicy(), RuntimeConfig(max_steps=5, instruction="x"),
                     safety=SafetyConfig(timeout_s=0.05))
