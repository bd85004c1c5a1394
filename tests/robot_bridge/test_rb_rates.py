"""Rate limits from the training data: a store's actions -> figures (hand-computed) -> the served metadata ->
`acce robot`'s default safety.max_rate, which clamps a too-fast action; an explicit max_rate overrides, and
max_rate_from_data=false turns them off."""
import time
from dataclasses import replace

import numpy as np
import pytest

from acce.action_rates import ActionRates, action_rates, checkpoint_action_rates
from acce.types import EnvSpec, Episode
from robot_bridge.robot import MockRobot
from robot_bridge.runtime import RobotRuntime, RuntimeConfig
from robot_bridge.safety import SafetyConfig, with_data_rates

HZ = 50.0
SPEC = EnvSpec(7, 4, "delta_xyz_gripper", HZ, ("front",), 8, 0.03)
RATES = ActionRates((0.05, 0.05, 0.05, 0.2), (), 99.9, 1.5, 2, 5, "runs/x/demos.zarr")
CHUNK = np.tile(np.array([[0.5, -0.5, 0.25, 1.0]], np.float32), (8, 1))
"""every reply: far faster than the data-derived limits allow from a standing start"""


class FakePolicy:
    """Replies CHUNK after a few ms; its metadata advertises `rates` as acce serve does."""

    def __init__(self, rates: ActionRates | None = RATES):
        self.metadata = {"chunk_len": 8, "max_delay_steps": 4, "execution_horizon": 4, "policy_version": 1,
                         "env_spec": SPEC.to_dict(), **({"action_rates": rates.to_dict()} if rates else {})}

    def infer(self, obs):
        time.sleep(0.005)
        return {"actions": CHUNK.copy(), "policy_version": 1}


def _run(policy, safety=None, steps=20):
    robot = MockRobot.from_spec(SPEC)
    runtime = RobotRuntime(robot, policy, RuntimeConfig(max_steps=steps, instruction="wave"), safety=safety)
    with robot:
        summary = runtime.run()
    sent = np.array([[a[k] for k in sorted(a)] for _, a in robot.sent])  # a0..a3
    return runtime, summary, sent


def test_data_rates_clamp_a_too_fast_action_and_the_start_line_names_them():
    runtime, summary, sent = _run(FakePolicy())
    np.testing.assert_allclose(runtime.safety.rate, [0.05, 0.05, 0.05, 0.2])
    assert runtime.rate_note.startswith("rate limits from the training data: [0.05, 0.05, 0.05, 0.2] (normalized")
    assert "1.5 x the 99.9th percentile" in runtime.rate_note and "runs/x/demos.zarr" in runtime.rate_note
    assert summary["safety_counts"]["rate"] >= 5 and summary["rate_limits"] == runtime.rate_note
    steps = np.abs(np.diff(np.vstack([np.zeros(4), sent]), axis=0))  # from the hold at 0
    assert np.all(steps <= np.array([0.05, 0.05, 0.05, 0.2]) + 1e-6)
    assert steps[:, 0].max() == pytest.approx(0.05, abs=1e-6)  # it did move, at the limit


@pytest.mark.parametrize("safety, note", [
    (SafetyConfig(max_rate=(2.0,) * 4), "safety.max_rate [2, 2, 2, 2]"),
    (SafetyConfig(max_rate_from_data=False), "none (safety.max_rate_from_data=false)")])
def test_an_explicit_config_overrides_or_disables_the_data_rates(safety, note):
    runtime, summary, sent = _run(FakePolicy(), safety=safety, steps=10)
    assert note in runtime.rate_note and summary["safety_counts"]["rate"] == 0
    assert np.abs(sent[-1] - CHUNK[0]).max() < 1e-6  # the chunk's action, unclamped


def test_without_data_rates_nothing_changes():
    runtime = RobotRuntime(MockRobot.from_spec(SPEC), FakePolicy(rates=None), RuntimeConfig(max_steps=1,
                                                                                           instruction="x"))
    assert runtime.safety.rate is None and runtime.rate_note == ""


def test_spec_units_take_the_data_units_and_name_the_joints():
    rates = ActionRates((0.1, 0.2), (5.0, 2.5), 100.0, 1.5, 1, 3, "d")
    spec = EnvSpec(2, 2, "joint_pos_abs", 30.0, ("front",), 8, action_names=("a.pos", "b.pos"),
                   action_low=(0.0, 0.0), action_high=(100.0, 25.0))
    cfg, note = with_data_rates(SafetyConfig(units="spec"), rates.to_dict(), spec)
    assert cfg.max_rate == (5.0, 2.5) and "[a.pos 5, b.pos 2.5] (data units per step" in note
    with pytest.raises(ValueError, match="malformed action_rates.*1 limits for 2 action dims.*safety.max_rate"):
        with_data_rates(SafetyConfig(), {**rates.to_dict(), "max_rate": [0.1]}, spec)


def _episode(actions: np.ndarray) -> Episode:
    t = len(actions)
    return Episode(obs={"image/front": np.zeros((t + 1, 32, 32, 3), np.uint8), "state": np.zeros((t + 1, 7),
                                                                                                  np.float32)},
                   action=actions.astype(np.float32), reward=np.zeros(t, np.float32), terminated=np.zeros(t, bool),
                   truncated=np.arange(t) == t - 1, success=np.zeros(t, bool), behavior_version=np.full(t, -1),
                   delay_steps=np.zeros(t, np.int32), policy_sampled=np.zeros(t, bool),
                   timestamp_s=np.arange(t + 1) / HZ, instruction="wave", task="real", task_id=-1, source="real",
                   seed=-1, episode_id="e", wm_version=-1)


def test_served_metadata_and_acce_robot_use_the_limits_of_the_checkpoints_dataset(tmp_path, write_ckpt, capsys):
    from acce.action_rates import record_action_rates, store_action_rates
    from acce.checkpoint import load_checkpoint
    from acce.store.episodes import EpisodeStore, StoreSchema
    from robot_bridge.cli import main as bridge_main
    from robot_bridge.host import PolicyHost

    store_path = tmp_path / "episodes.zarr"  # `acce train --data runs/arm/episodes.zarr`: an acce store, as is
    ckpt = write_ckpt(tmp_path / "run" / "checkpoints" / "latest.pt", overrides=[
        f"dataset.path={store_path}", "dataset.max_rate_percentile=100", "dataset.max_rate_margin=2.0"])
    data = load_checkpoint(ckpt)
    spec = EnvSpec.from_dict(data["learner"]["policy"]["env_spec"])
    rates, why = checkpoint_action_rates(data, ckpt, spec)
    assert rates is None and f"trained on {store_path} but no episode store" in why
    store = EpisodeStore.create(store_path, **StoreSchema.fields_for(spec))
    first = np.zeros((4, 4))
    first[:, 0] = [0.0, 0.1, 0.3, -0.1]  # |changes| 0.1, 0.2, 0.4
    second = np.zeros((2, 4))
    second[:, 0] = [0.5, 0.45]  # 0.05; the jump -0.1 -> 0.5 between the episodes is no step
    store.append_many([_episode(first), _episode(second)])
    host = PolicyHost(ckpt)
    try:
        meta = host.metadata()["action_rates"]
        # 100th percentile 0.4 x margin 2 = 0.8; dims that never moved get the floor MIN_RATE = 0.01
        np.testing.assert_allclose(meta["max_rate"], [0.8, 0.01, 0.01, 0.01], rtol=1e-6)
        assert (meta["episodes"], meta["steps"], meta["max_rate_units"]) == (2, 4, [])
        assert meta["source"] == str(store_path)
    finally:
        host.close()

    # `acce train --data DIR` on a LeRobotDataset: the run's import run/demos.zarr, with the figures it recorded
    demos = EpisodeStore.create(tmp_path / "run2" / "demos.zarr", **StoreSchema.fields_for(spec))
    demos.append_many([_episode(first), _episode(second)])
    recorded = store_action_rates(demos, 100.0, 2.0)
    record_action_rates(demos, replace(recorded, max_rate=(0.5, 0.25, 0.25, 0.25), source="the import"))
    write_ckpt(tmp_path / "run2" / "checkpoints" / "latest.pt", overrides=[
        f"dataset.path={tmp_path / 'pick_cube'}", "dataset.max_rate_percentile=100", "dataset.max_rate_margin=2.0"])
    capsys.readouterr()
    assert bridge_main(["robot", "--robot", "mock", "--checkpoint", str(tmp_path / "run2"), "--max-steps", "3",
                        "--instruction", "wave"]) == 0
    assert capsys.readouterr().out.startswith(
        "rate limits from the training data: [0.5, 0.25, 0.25, 0.25] (normalized units per step; 2 x the 100th "
        "percentile of the per-step change over 2 episodes of the import)")


def test_rates_math_and_lookup_order():
    spec = EnvSpec(2, 2, "joint_pos_abs", 30.0, ("front",), 8, action_low=(0.0, -10.0), action_high=(45.0, 10.0))
    # dim 0 changes 0.2, 0.4 | 0.6 (median 0.4), dim 1 0.1 each (a one-step episode has none): median x 1.5 = 0.6
    # and 0.15 normalized, x (high - low) / 2 = 13.5 and 1.5 data units
    units = (spec.action_low, spec.action_high)
    r = action_rates([np.array([[0.0, 0.0], [0.2, 0.1], [0.6, 0.2]]), np.array([[0.0, 0.0], [0.6, 0.1]]),
                      np.array([[1.0, 0.0]])], units, 50.0, 1.5, "s")
    np.testing.assert_allclose(r.max_rate, [0.6, 0.15])
    np.testing.assert_allclose(r.max_rate_units, [13.5, 1.5])
    assert (r.episodes, r.steps) == (2, 3) and action_rates([np.zeros((1, 2))], units, 50.0, 1.5, "s") is None
    assert checkpoint_action_rates({"action_rates": r.to_dict()}, "x.pt", spec) == (r, "")  # the checkpoint's own
    assert checkpoint_action_rates({"config": {"dataset": {"path": ""}}}, "x.pt", spec) == (None, "")
