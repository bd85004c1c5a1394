"""The whole bridge on loopback: `acce serve` + SimRobot + runtime, and the watchdog when the server process dies."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from acce.types import EnvSpec
from robot_bridge.client import RemotePolicy
from robot_bridge.robot import MockRobot
from robot_bridge.runtime import RobotRuntime, RuntimeConfig
from robot_bridge.safety import SafetyConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sim_robot_over_the_bridge_records_rehearsal(server, tmp_path):
    from acce.store.episodes import EpisodeStore
    from robot_bridge.sim_robot import SimRobot
    from sim.env import TabletopEnv
    from sim.latency import EmpiricalLatency
    from sim.tasks import task_id

    policy = RemotePolicy(server.url)
    meta = policy.metadata
    robot = SimRobot("reach", image_size=meta["image_size"], cameras=tuple(meta["cameras"]))
    cfg = RuntimeConfig(episodes=2, max_steps=20, out_dir=str(tmp_path), task="reach")
    with robot:
        summary = RobotRuntime(robot, policy, cfg).run()
    policy.close()
    assert summary["episodes"] == 2 and summary["executor_counts"]["replies"] >= 8
    assert summary["safety_counts"]["watchdog"] == 0 and summary["overruns"] <= 5  # 2 shared cores: some slack
    store = EpisodeStore.open(tmp_path / "episodes.zarr")
    assert len(store) == 2 and store.schema.control_hz == 10.0
    ep = store[0]
    assert ep.source == "sim" and ep.task == "reach" and ep.task_id == task_id("reach") and ep.seed == 1_000_000
    assert ep.obs["image/front"].shape == (ep.num_steps + 1, 32, 32, 3) and ep.policy_sampled[2:].mean() > 0.8
    assert set(np.unique(ep.behavior_version[ep.policy_sampled])) == {3}
    env = TabletopEnv("reach", image_size=32)  # same seed, same layout and instruction as in-sim evaluation
    env.reset(seed=1_000_000)
    assert ep.instruction == env.instruction
    env.close()
    model = EmpiricalLatency.from_file(tmp_path / "latency.json", control_hz=10.0)
    assert model.max_steps >= 1 and float(np.median(model.latencies_s)) < 0.5
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["requests"][0]["policy_version"] == 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_watchdog_stops_the_robot_when_the_server_is_killed(checkpoint, tmp_path, capsys):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "robot_bridge.cli", "serve", "--checkpoint", str(checkpoint),
                             "--port", str(port), "--reload-interval-s", "0"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while True:  # wait for /healthz
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.2)
        policy = RemotePolicy(f"ws://127.0.0.1:{port}", request_timeout_s=2.0, open_timeout_s=1.0)
        robot = MockRobot.from_spec(EnvSpec.from_dict(policy.metadata["env_spec"]))
        safety = SafetyConfig(timeout_s=0.6)
        runtime = RobotRuntime(robot, policy, RuntimeConfig(max_steps=200, instruction="touch the red cube",
                                                            abort_after_s=1.0, out_dir=str(tmp_path)), safety=safety)
        import threading
        killed = {}

        def kill_later():
            time.sleep(1.5)
            killed["wall"] = time.time()
            proc.send_signal(signal.SIGKILL)
        threading.Thread(target=kill_later).start()
        with robot:
            summary = runtime.run()
        policy.close()
        assert summary["stop_reasons"] == ["watchdog"]
        # the cause reaches the console and the summary, not only episodes.jsonl
        assert summary["request_error_causes"] and sum(summary["request_error_causes"].values()) == \
            summary["executor_counts"]["request_errors"]
        assert "policy request failed: " in capsys.readouterr().err
        from acce.store.episodes import EpisodeStore
        ep = EpisodeStore.open(tmp_path / "episodes.zarr")[0]
        events = json.loads((tmp_path / "episodes.jsonl").read_text())["events"]
        first = min(e["t"] for e in events if e["kind"] == "watchdog")
        # the watchdog holds within timeout_s (+ one control period of slack per side) of the kill
        assert ep.timestamp_s[first] - killed["wall"] <= safety.timeout_s + 0.2
        assert np.all(ep.action[first:] == 0) and not ep.policy_sampled[first:].any()
        assert ep.timestamp_s[-1] - killed["wall"] <= safety.timeout_s + 1.0 + 0.5  # then the run stopped
        assert ep.policy_sampled[:first].sum() >= 5  # it was really driving before the kill
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
