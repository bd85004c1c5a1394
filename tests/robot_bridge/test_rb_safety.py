"""Safety envelope: hand-computed clamps, NaN rejection, watchdog/e-stop holds, counts and the sampled flag."""
import numpy as np
import pytest

from robot_bridge.safety import SafetyConfig, SafetyEnvelope

STATE = np.zeros(7, np.float32)


def test_bounds_and_rate_limit():
    env = SafetyEnvelope(SafetyConfig(action_high=(0.5, 1, 1, 1), action_low=(-1, -1, -1, -1),
                                      max_rate=(0.2, 0.2, 0.2, 2.0)), 4)
    r = env.apply(np.array([0.8, -0.5, 0.1, 1.0]), STATE)
    # bounds: 0.8 -> 0.5; rate from the previous (zero) action: 0.5 -> 0.2, -0.5 -> -0.2; 0.1 and 1.0 pass
    np.testing.assert_allclose(r.action, [0.2, -0.2, 0.1, 1.0])
    assert not r.sampled and [e["kind"] for e in r.events] == ["bounds", "rate"]
    r = env.apply(np.array([0.8, -0.5, 0.1, 1.0]), STATE)
    np.testing.assert_allclose(r.action, [0.4, -0.4, 0.1, 1.0])  # 0.2 + 0.2, -0.2 - 0.2
    r = env.apply(np.array([0.45, -0.45, 0.1, 1.0]), STATE)  # within both limits: untouched, sampled
    np.testing.assert_allclose(r.action, [0.45, -0.45, 0.1, 1.0])
    assert r.sampled and not r.events
    assert env.counts["bounds"] == 2 and env.counts["rate"] == 2


def test_nan_and_inf_are_rejected_with_a_hold_that_keeps_the_gripper():
    env = SafetyEnvelope(SafetyConfig(hold_keep_dims=(3,)), 4)
    env.apply(np.array([0.3, 0.0, 0.0, 1.0]), STATE)  # gripper closed
    for bad in ([np.nan, 0, 0, 1], [0, np.inf, 0, 1], [0, 0, -np.inf, np.nan]):
        r = env.apply(np.array(bad, np.float32), STATE)
        np.testing.assert_array_equal(r.action, [0, 0, 0, 1.0])  # no motion, still holding the object
        assert r.hold and not r.sampled and r.events[0]["kind"] == "nonfinite"
    assert env.counts["nonfinite"] == 3
    assert np.all(np.isfinite(env.apply(np.full(3, 0.1), STATE).action))  # wrong shape: rejected too


def test_workspace_box_on_the_commanded_fingertip_target():
    env = SafetyEnvelope(SafetyConfig(workspace_low=(-0.1, -0.1, 0.0), workspace_high=(0.1, 0.1, 0.2),
                                      max_step_m=0.03), 4)
    state = np.array([0.09, 0.0, 0.01, 0, 0, 0, 1], np.float32)
    r = env.apply(np.array([1.0, 0.5, -1.0, -1.0]), state)
    # target = tip + a * 0.03 = (0.12, 0.015, -0.02) -> clipped (0.1, 0.015, 0.0)
    # -> a_x = (0.1 - 0.09) / 0.03 = 1/3, a_y unchanged 0.5, a_z = (0.0 - 0.01) / 0.03 = -1/3
    np.testing.assert_allclose(r.action, [1 / 3, 0.5, -1 / 3, -1.0], atol=1e-5)
    assert r.events[0]["kind"] == "workspace" and not r.sampled
    outside = np.array([0.15, 0.0, 0.1, 0, 0, 0, 1], np.float32)  # already outside: may only come back
    np.testing.assert_allclose(env.apply(np.array([1.0, 0, 0, 0]), outside).action, [0, 0, 0, 0], atol=1e-6)
    r = env.apply(np.array([-1.0, 0, 0, 0]), outside)
    np.testing.assert_allclose(r.action, [-1.0, 0, 0, 0])
    assert r.sampled


def test_watchdog_nothing_to_execute_and_estop_hold():
    pressed = {"button": False}
    env = SafetyEnvelope(SafetyConfig(hold_keep_dims=(3,)), 4, estop_hook=lambda: pressed["button"])
    env.apply(np.array([0.5, 0.5, 0.5, -1.0]), STATE)
    r = env.apply(np.array([0.5, 0.5, 0.5, -1.0]), STATE, fresh=False)
    np.testing.assert_array_equal(r.action, [0, 0, 0, -1.0])
    assert r.hold and r.events[0]["kind"] == "watchdog"
    r = env.apply(None, STATE)
    assert r.hold and r.events[0]["kind"] == "hold"
    pressed["button"] = True
    assert env.apply(np.array([0.1, 0, 0, 1.0]), STATE).events[0]["kind"] == "estop"
    pressed["button"] = False  # latched: releasing the button does not resume motion
    r = env.apply(np.array([0.1, 0, 0, 1.0]), STATE)
    assert r.hold and r.events[0]["kind"] == "estop" and env.estopped
    assert env.counts == {"estop": 2, "watchdog": 1, "hold": 1, "nonfinite": 0, "bounds": 0, "rate": 0,
                          "workspace": 0}


def test_small_clamps_within_tolerance_stay_sampled():
    env = SafetyEnvelope(SafetyConfig(sampled_tolerance=1e-3), 2)
    r = env.apply(np.array([1.0005, 0.0]), STATE)
    assert r.sampled and r.events[0]["kind"] == "bounds"


@pytest.mark.parametrize("fields, match", [
    ({"action_low": (0.0,), "action_high": (-1.0,)}, "<="), ({"max_rate": (0.0,)}, "positive"),
    ({"timeout_s": 0.0}, "timeout_s"), ({"workspace_low": (0, 0, 0)}, "both"),
    ({"workspace_low": (0, 0, 0), "workspace_high": (1, 1, 1)}, "max_step_m")])
def test_config_contradictions_fail_with_the_fix(fields, match):
    with pytest.raises(ValueError, match=match):
        SafetyConfig(**fields)


def test_config_dims_must_match_the_robot():
    with pytest.raises(ValueError, match="dims"):
        SafetyEnvelope(SafetyConfig(max_rate=(0.1, 0.1)), 4)
    with pytest.raises(ValueError, match="unknown safety field"):
        SafetyConfig.from_dict({"max_speed": 1})
