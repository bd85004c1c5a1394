"""A robot's LeRobotDataset, written here by lerobot's own API (6 joints in degrees, two cameras, video, 30 fps), all
the way to a robot: import -> env spec -> a policy cloned on it -> served -> a robot with the same features gets
actions in the dataset's units; mismatched robots, unmapped keys and damaged videos are refused with one error."""
import os
import shutil
import time
from dataclasses import dataclass

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may touch the hub
pytest.importorskip("lerobot")

from lerobot.robots import Robot, RobotConfig  # noqa: E402

from acce.data_config import DatasetConfig  # noqa: E402
from acce.store import EpisodeStore, import_lerobot  # noqa: E402

JOINTS = ("shoulder_pan.pos", "shoulder_lift.pos", "elbow_flex.pos", "wrist_flex.pos", "wrist_roll.pos",
          "gripper.pos")
TINY_POLICY = ["policy.language=hash", "policy.resnet_hidden_sizes=[8,16,32]", "policy.image_grid=2",
               "policy.trunk_width=32", "policy.trunk_layers=1", "policy.trunk_heads=2", "policy.chunk_len=8",
               "policy.max_delay_steps=4", "rollout.execution_horizon=4"]
"""a policy small enough to clone in seconds (shared with test_dataset_train.py)"""
TINY = TINY_POLICY + ["env.cameras=[front,wrist]"]


def _video_decoder_problem() -> str:
    try:
        import torchcodec.decoders  # noqa: F401
    except (ImportError, OSError, RuntimeError) as err:
        return f"torchcodec cannot load FFmpeg ({type(err).__name__}); run scripts/setup.sh as root to install it"
    return ""


needs_video = pytest.mark.skipif(bool(_video_decoder_problem()), reason=_video_decoder_problem() or "-")


def _joint_features(cameras: dict[str, str], state_key="observation.state", extra=None) -> dict:
    feats = {key: {"dtype": kind, "shape": (24, 32, 3), "names": ["height", "width", "channels"]}
             for key, kind in cameras.items()}
    feats[state_key] = {"dtype": "float32", "shape": (6,), "names": list(JOINTS)}
    feats["action"] = {"dtype": "float32", "shape": (6,), "names": list(JOINTS)}
    return {**feats, **(extra or {})}


def _write(root, features, episodes=3, frames=10, seed=0):
    """A LeRobotDataset by lerobot's API: joints in degrees (a leader arm's teleoperation), the wrist camera a
    flat grey that brightens by 10 per frame (survives lossy video), the front camera noise."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.utils.utils import SuppressProgressBars

    rng = np.random.default_rng(seed)
    use_videos = any(f["dtype"] == "video" for f in features.values())
    ds = LeRobotDataset.create("test/so101", fps=30, root=root, features=features, use_videos=use_videos,
                               robot_type="so101_follower")
    actions = []
    with SuppressProgressBars():
        for e in range(episodes):
            for t in range(frames):
                action = (np.array([-60, -40, 20, 0, 45, 5]) + rng.uniform(-20, 20, 6)).astype(np.float32)
                frame = {k: rng.integers(0, 256, (24, 32, 3), np.uint8) for k in features
                         if features[k]["dtype"] in ("video", "image")}
                frame.update({k: np.full((24, 32, 3), 60 + 10 * t, np.uint8) for k in frame if "wrist" in k})
                frame.update({k: (action + rng.normal(0, 1, 6)).astype(np.float32) for k in features
                              if features[k]["dtype"] == "float32" and k != "action"})
                ds.add_frame({**frame, "action": action, "task": f"pick the cube {e % 2}"})
                actions.append(action)
            ds.save_episode()
    ds.finalize()
    return root, np.stack(actions)


@pytest.fixture(scope="module")
def video_dataset(tmp_path_factory):
    if _video_decoder_problem():
        pytest.skip(_video_decoder_problem())
    return _write(tmp_path_factory.mktemp("lr") / "so101",
                  _joint_features({"observation.images.front": "video", "observation.images.wrist": "video"}))


@pytest.fixture(scope="module")
def imported(video_dataset, tmp_path_factory):
    root, actions = video_dataset
    store = import_lerobot(root, tmp_path_factory.mktemp("store") / "s.zarr", config=DatasetConfig(image_size=32))
    return store, actions


@needs_video
def test_video_dataset_imports_with_its_spec_and_units(imported):
    store, actions = imported
    spec = store.schema.env_spec
    assert (spec.state_dim, spec.action_dim, spec.action_repr, spec.control_hz, spec.cameras, spec.image_size) == (
        6, 6, "joint_pos_abs", 30.0, ("front", "wrist"), 32)
    assert spec.action_names == JOINTS and spec.state_names == JOINTS
    np.testing.assert_allclose(spec.action_low, actions.min(0), rtol=1e-6)
    np.testing.assert_allclose(spec.action_high, actions.max(0), rtol=1e-6)
    assert len(store) == 3 and store.schema.extra == {"lerobot_robot_type": "so101_follower"}
    ep = store[1]
    assert ep.num_steps == 9 and ep.instruction == "pick the cube 1" and ep.source == "demo"
    assert ep.obs["image/front"].shape == (10, 32, 32, 3) and ep.obs["image/wrist"].dtype == np.uint8
    # the wrist camera's grey ramp 60, 70, ... survives AV1 encoding and the resize to within a few levels
    np.testing.assert_allclose(ep.obs["image/wrist"][:, 16, 16, 0], 60 + 10 * np.arange(10), atol=4)
    # actions in [-1, 1]; the spec maps them back to the recorded degrees (float32 rounding only)
    assert np.abs(ep.action).max() <= 1.0
    np.testing.assert_allclose(spec.to_units(ep.action), actions[10:19], atol=1e-3)


def _clone_and_save(store, path, steps=3):
    """A policy built for the store's spec, cloned a few steps on its episodes (acce's BC), saved as acce train
    saves a checkpoint."""
    from acce.bc import DemoDataset, bc_train
    from acce.checkpoint import save_checkpoint
    from acce.config import load
    from acce.configlib import to_dict
    from acce.policy.build import build_policy
    from acce.runtime.learner import make_learner

    cfg = load(None, TINY + ["env.image_size=32"])
    spec = store.schema.env_spec
    data = DemoDataset(list(store.iter_episodes()), cfg.policy.chunk_len, cfg.policy.max_delay_steps,
                       spec.action_dim)
    policy = build_policy(cfg, data.states, aux_dim=0, spec=spec, privileged_dim=0)
    learner = make_learner(policy, cfg.learner, seed=0)
    losses = bc_train(learner, data, steps, batch_size=8, progress=False)
    assert len(losses) == steps and np.all(np.isfinite(losses))
    return save_checkpoint(path, {"config": to_dict(cfg), "learner": {"policy": policy.policy_state(),
                                                                       "version": 1}})


@needs_video
def test_cloned_policy_served_drives_a_robot_with_the_same_features_in_the_datasets_units(imported, tmp_path):
    from robot_bridge.client import RemotePolicy
    from robot_bridge.host import PolicyHost
    from robot_bridge.robot import MockRobot
    from robot_bridge.runtime import RobotRuntime, RuntimeConfig
    from robot_bridge.server import PolicyServer, ServeConfig

    store, actions = imported
    spec = store.schema.env_spec
    host = PolicyHost(_clone_and_save(store, tmp_path / "ckpt" / "latest.pt"), torch_threads=1)
    server = PolicyServer(host, ServeConfig(port=0, reload_interval_s=0)).start()  # what `acce serve` runs
    policy = RemotePolicy(server.url)
    try:
        served = policy.metadata["env_spec"]  # the spec `acce serve` advertises, names and units included
        assert served["action_names"] == list(JOINTS) and served["action_low"] == list(spec.action_low)
        robot = MockRobot.from_spec(spec)
        with robot:
            summary = RobotRuntime(robot, policy, RuntimeConfig(max_steps=12, instruction="pick the cube 0")).run()
        assert summary["episodes"] == 1 and robot.sent
        for _, sent in robot.sent:  # absolute joint targets in degrees, inside the range the dataset recorded
            assert list(sent) == list(JOINTS)
            assert all(lo - 1e-6 <= sent[k] <= hi + 1e-6 for k, lo, hi in zip(JOINTS, spec.action_low,
                                                                               spec.action_high))

        other = MockRobot(state_dim=5, action_dim=5, image_size=32, cameras=("front", "wrist"),
                          state_names=JOINTS[:5], action_names=JOINTS[:5])
        with pytest.raises(ValueError, match=r"acts on \[.*'gripper.pos'\].*robot 'mock' takes actions "
                                             r"\[.*'wrist_roll.pos'\]"):  # one line naming both sides
            RobotRuntime(other, policy, RuntimeConfig(max_steps=5, instruction="x"))
        renamed = MockRobot(state_dim=6, action_dim=6, image_size=32, cameras=("front", "wrist"),
                            state_names=JOINTS, action_names=tuple(f"joint{i}" for i in range(6)))
        io = MockRobot.from_spec(spec).default_io(32, spec)  # the spec's keys, sent to a robot that has others
        with pytest.raises(ValueError, match=r"acts on \['shoulder_pan.pos'.*takes actions \['joint0'"):
            RobotRuntime(renamed, policy, RuntimeConfig(max_steps=5, instruction="x"), io=io)
    finally:
        policy.close()
        server.stop()
        host.close()


class _FakeArm(Robot):
    """A lerobot Robot (lerobot's own ABC) with the dataset's joints and two cameras, no hardware; lerobot's factory
    builds it from its registered config (FakeSo101Config -> FakeSo101, found in this module)."""

    joints = JOINTS

    def __init__(self, config):
        super().__init__(config)
        self.pos, self.sent, self._connected = {k: 0.0 for k in self.joints}, [], False

    @property
    def observation_features(self):
        return {**{k: float for k in self.joints}, "front": (24, 32, 3), "wrist": (24, 32, 3)}

    @property
    def action_features(self):
        return {k: float for k in self.joints}

    @property
    def is_connected(self):
        return self._connected

    @property
    def is_calibrated(self):
        return True

    def connect(self, calibrate=True):
        self._connected = True

    def calibrate(self):
        pass

    def configure(self):
        pass

    def get_observation(self):
        return {**self.pos, "front": np.zeros((24, 32, 3), np.uint8), "wrist": np.zeros((24, 32, 3), np.uint8)}

    def send_action(self, action):
        self.sent.append((time.monotonic(), dict(action)))
        return dict(action)

    def disconnect(self):
        self._connected = False


@RobotConfig.register_subclass("acce_fake_so101")
@dataclass
class FakeSo101Config(RobotConfig):
    pass


class FakeSo101(_FakeArm):
    config_class, name = FakeSo101Config, "acce_fake_so101"


@RobotConfig.register_subclass("acce_fake_five_joints")
@dataclass
class FakeFiveJointsConfig(RobotConfig):
    pass


class FakeFiveJoints(_FakeArm):
    config_class, name, joints = FakeFiveJointsConfig, "acce_fake_five_joints", JOINTS[:5]


@needs_video
def test_lerobot_arm_takes_keys_and_units_from_the_spec_and_a_mismatched_arm_is_refused(imported, tmp_path):
    from robot_bridge.client import LocalPolicy
    from robot_bridge.lerobot_robot import LeRobotRobot
    from robot_bridge.runtime import RobotRuntime, RuntimeConfig

    store, _ = imported
    spec = store.schema.env_spec
    policy = LocalPolicy(_clone_and_save(store, tmp_path / "latest.pt", steps=1), torch_threads=1)
    try:
        arm = LeRobotRobot({"type": "acce_fake_so101", "id": "a", "calibration_dir": str(tmp_path / "c")}, {},
                           {"max_rate": [5.0] * 6, "units": "spec"})  # at most 5 degrees per step per joint
        with arm:
            RobotRuntime(arm, policy, RuntimeConfig(max_steps=10, instruction="pick the cube 0")).run()
        sent = [a for _, a in arm.robot.sent]
        assert sent and all(list(a) == list(JOINTS) for a in sent)
        steps = np.abs(np.diff([[a[k] for k in JOINTS] for a in sent], axis=0))
        assert steps.max(initial=0.0) <= 5.0 + 1e-3
        assert arm.default_io(32, spec).action_low == spec.action_low

        small = LeRobotRobot({"type": "acce_fake_five_joints", "id": "b", "calibration_dir": str(tmp_path / "c")}, {})
        with pytest.raises(ValueError, match=r"policy and robot do not match|acts on .* takes actions"):
            RobotRuntime(small, policy, RuntimeConfig(max_steps=5, instruction="x"))
    finally:
        policy.close()


@needs_video
@pytest.mark.parametrize("torchcodec", [True, False], ids=["torchcodec", "pyav"])
def test_a_damaged_video_is_refused_and_no_store_is_left(video_dataset, tmp_path, monkeypatch, torchcodec):
    import acce.store.lerobot_import as li

    if not torchcodec:
        monkeypatch.setattr(li, "_load_torchcodec", lambda: (_ for _ in ()).throw(RuntimeError("no FFmpeg")))
    root, _ = video_dataset
    broken = shutil.copytree(root, tmp_path / "broken")
    video = next((broken / "videos" / "observation.images.wrist").rglob("*.mp4"))
    data = video.read_bytes()
    video.write_bytes(data[:48] + bytes(len(data) - 48))  # header kept, every frame zeroed
    with pytest.raises(ValueError, match="observation.images.wrist.*damaged.*nothing was imported"):
        import_lerobot(broken, tmp_path / "s.zarr", config=DatasetConfig(image_size=32))
    assert not (tmp_path / "s.zarr").exists()


@needs_video
def test_pyav_decodes_when_torchcodec_cannot_load_ffmpeg(imported, video_dataset, tmp_path, monkeypatch, caplog):
    import acce.store.lerobot_import as li

    def no_ffmpeg():  # what torchcodec raises on import when FFmpeg's shared libraries are missing
        raise RuntimeError("Could not load libtorchcodec. Likely causes:\n  1. FFmpeg is not properly installed")
    monkeypatch.setattr(li, "_load_torchcodec", no_ffmpeg)
    with caplog.at_level("WARNING", logger=li.__name__):
        store = import_lerobot(video_dataset[0], tmp_path / "s.zarr", config=DatasetConfig(image_size=32))
    warned = [r.getMessage() for r in caplog.records if r.name == li.__name__]
    assert len(warned) == 1 and "RuntimeError: Could not load libtorchcodec" in warned[0] and "PyAV" in warned[0]
    reference = imported[0]  # the same dataset through torchcodec
    for i in range(len(reference)):
        for cam in ("image/front", "image/wrist"):  # the same decoded frames (both backends use FFmpeg's decoder)
            diff = np.abs(store[i].obs[cam].astype(int) - reference[i].obs[cam].astype(int))
            assert diff.max() <= 2, (i, cam, diff.max())


def test_import_records_rate_limits_from_the_recorded_actions(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from acce.action_rates import recorded_action_rates, store_action_rates

    # shoulder_pan (degrees): episode 0 goes 0, 10, 15, 45, 45 and episode 1 0, 3, 5, 5 (each last frame's action
    # is dropped); shoulder_lift counts 0, 1, 2, ...; the other joints stand still at 7
    pan = ([0, 10, 15, 45, 45], [0, 3, 5, 5])
    ds = LeRobotDataset.create("test/rates", fps=30, root=tmp_path / "ds", robot_type="so101_follower",
                               features=_joint_features({"observation.images.top": "image"}), use_videos=False)
    for values in pan:
        for t, v in enumerate(values):
            action = np.array([v, t, 7, 7, 7, 7], np.float32)
            ds.add_frame({"observation.images.top": np.zeros((24, 32, 3), np.uint8), "observation.state": action,
                          "action": action, "task": "pick"})
        ds.save_episode()
    ds.finalize()
    store = import_lerobot(tmp_path / "ds", tmp_path / "s.zarr", config=DatasetConfig(
        image_size=16, max_rate_percentile=100.0, max_rate_margin=1.5))
    rates = recorded_action_rates(store)
    # pan steps 10, 5, 30 | 3, 2 (the jump 45 -> 0 between episodes is none): 30 x 1.5 = 45 degrees, on a range of
    # [0, 45] that is 2.0 normalized; lift steps 1 each: 1.5 degrees on [0, 4] = 0.75; still joints (range 7 +- 1)
    # get the floor 0.01 normalized = 0.01 degrees
    np.testing.assert_allclose(rates.max_rate_units, [45.0, 1.5] + [0.01] * 4, rtol=1e-4)
    np.testing.assert_allclose(rates.max_rate, [2.0, 0.75] + [0.01] * 4, rtol=1e-4)
    assert (rates.episodes, rates.steps, rates.percentile, rates.margin) == (2, 5, 100.0, 1.5)
    assert store.schema.extra == {"lerobot_robot_type": "so101_follower"}  # the schema is untouched
    median = store_action_rates(store, 50.0, 1.5)  # other settings: measured again, median of 2, 3, 5, 10, 30
    np.testing.assert_allclose(median.max_rate_units[:2], [7.5, 1.5], rtol=1e-4)


def test_unmapped_and_missing_keys_name_the_key_and_the_override(tmp_path):
    extra = {"observation.environment_state": {"dtype": "float32", "shape": (6,), "names": None}}
    root, _ = _write(tmp_path / "ds", _joint_features({"observation.images.top": "image"}, extra=extra),
                     episodes=1, frames=4)
    with pytest.raises(ValueError, match=r"\['observation.environment_state'\].*"
                                         r"dataset.ignore=\[observation.environment_state\]"):
        import_lerobot(root, tmp_path / "s.zarr")
    assert not (tmp_path / "s.zarr").exists()
    store = import_lerobot(root, tmp_path / "s.zarr", config=DatasetConfig(
        ignore=("observation.environment_state",), image_size=16))
    assert store.schema.env_spec.cameras == ("top",) and len(store) == 1

    root, _ = _write(tmp_path / "ds2", _joint_features({"cam_high": "image"}, state_key="observation.joints"),
                     episodes=1, frames=3)
    with pytest.raises(ValueError, match=r"no observation.images.\* feature.*dataset.cameras="):
        import_lerobot(root, tmp_path / "t.zarr")
    with pytest.raises(ValueError, match=r"no float vector feature 'observation.state'.*dataset.state_key="):
        import_lerobot(root, tmp_path / "t.zarr", config=DatasetConfig(cameras={"high": "cam_high"}))
    store = import_lerobot(root, tmp_path / "t.zarr", config=DatasetConfig(
        cameras={"high": "cam_high"}, state_key="observation.joints", image_size=16))
    assert store.schema.env_spec.cameras == ("high",) and not (tmp_path / "s2.zarr").exists()


def test_safety_limits_in_the_specs_units():
    from acce.types import EnvSpec
    from robot_bridge.safety import SafetyConfig, SafetyEnvelope

    spec = EnvSpec(2, 2, "joint_pos_abs", 30.0, ("front",), 32, action_names=("a.pos", "b.pos"),
                   action_low=(-100.0, 0.0), action_high=(100.0, 50.0))
    # joint limit 50 degrees on a's [-100, 100] is 0.5 normalized; b's 10 degrees per step is 10 * 2 / 50 = 0.4
    env = SafetyEnvelope(SafetyConfig(action_low=(-100.0, 0.0), action_high=(50.0, 50.0), max_rate=(200.0, 10.0),
                                      units="spec"), 2, spec=spec)
    out = env.apply(np.array([0.9, 1.0]), None).action
    np.testing.assert_allclose(out, [0.5, 0.4])
    np.testing.assert_allclose(spec.to_units(out), [50.0, 35.0])
    with pytest.raises(ValueError, match="units=spec.*no action_low"):
        SafetyEnvelope(SafetyConfig(units="spec"), 2, spec=EnvSpec(2, 2, "normalized", 30.0, ("front",), 32))


def test_collect_cli_imports_with_dataset_overrides(tmp_path, capsys):
    from acce.cli import main

    root, _ = _write(tmp_path / "ds", _joint_features({"observation.images.top": "image"}), episodes=2, frames=3)
    assert main(["collect", "--import-lerobot", str(root), "--out", str(tmp_path / "s.zarr"),
                 "dataset.image_size=16"]) == 0
    out = capsys.readouterr().out
    assert "imported 2 episodes" in out and "action 6 (joint_pos_abs" in out and "30 Hz" in out
    assert EpisodeStore.open(tmp_path / "s.zarr").schema.env_spec.image_size == 16
