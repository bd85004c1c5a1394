"""Mixing simulator and imagined segments into learner batches (acce/runtime/mixer.py), with counting fakes."""
import numpy as np
import pytest

from acce.config import load
from acce.configlib import ConfigError
from acce.runtime.mixer import SourceMixer
from acce.runtime.queue import RolloutQueue, StalenessGate
from acce.types import Segment


def seg(source: str, behavior_version: int = 0, reward: float = 0.0, wm_version: int = -1, t: int = 2) -> Segment:
    """A segment with only what the mixer reads filled in meaningfully."""
    z = np.zeros(t, np.float32)
    return Segment(obs={"state": np.zeros((t, 7), np.float32)}, instruction=["x"] * t, task_id=np.zeros(t, np.int64),
                   prefix=np.zeros((t, 1, 4), np.float32), delay_steps=np.zeros(t, np.int32),
                   chunk=np.zeros((t, 4, 4), np.float32), exec_mask=np.ones((t, 4), bool),
                   exec_len=np.full(t, 4, np.int32), behavior_logp=z, behavior_logp_pos=np.zeros((t, 4), np.float32),
                   behavior_value=z, reward=np.full(t, reward, np.float32), discount=z + 0.9,
                   terminated=np.zeros(t, bool), truncated=np.zeros(t, bool), success=np.zeros(t, bool),
                   next_index=np.full(t, -1, np.int64), bootstrap={}, behavior_version=np.full(t, behavior_version),
                   source=source, wm_version=np.full(t, wm_version, np.int64), episode_id=np.zeros(t, np.int64),
                   env_step=np.zeros(t, np.int64), timestamp_s=np.zeros(t))


class CountingSource:
    """A queue stand-in that records every request; `blocking` marks the side the learner may wait on."""

    def __init__(self, source: str, available: int | None = None):
        self.source, self.available, self.calls = source, available, []

    def __call__(self, n: int):
        self.calls.append(n)
        k = n if self.available is None else min(n, self.available)
        if self.available is not None:
            self.available -= k
        return [seg(self.source) for _ in range(k)]


def test_a_batch_takes_the_sim_share_then_the_waiting_imagined_share():
    sim, imagined = CountingSource("sim"), CountingSource("imagined", available=10)
    mixer = SourceMixer(8, 3)
    batch = mixer.take(sim, imagined)
    assert sim.calls == [5] and imagined.calls == [3]
    assert [s.source for s in batch].count("imagined") == 3 and len(batch) == 8
    assert mixer.shortfall == 0 and mixer.consumed == {"sim": 5, "imagined": 3}


def test_a_short_imagined_share_is_filled_from_the_simulator_and_counted():
    shifted = []
    sim, imagined = CountingSource("sim"), CountingSource("imagined", available=1)
    mixer = SourceMixer(8, 3, on_shortfall=shifted.append)
    batch = mixer.take(sim, imagined)
    assert sim.calls == [5, 2] and imagined.calls == [3]  # imagination asked once, never waited for
    assert [s.source for s in batch].count("imagined") == 1 and len(batch) == 8
    assert mixer.shortfall == 2 and shifted == [2]
    assert mixer.metrics(batch, 0)["queue/imagined_shortfall"] == 2


def test_long_run_composition_is_exact_when_imagination_keeps_up():
    sim, imagined = CountingSource("sim"), CountingSource("imagined")
    mixer = SourceMixer(4, 1)  # imagined_fraction 0.25
    fracs = [mixer.metrics(mixer.take(sim, imagined), 0)["queue/imagined_frac"] for _ in range(50)]
    assert fracs == [0.25] * 50 and mixer.consumed == {"sim": 150, "imagined": 50}


def test_stopping_while_waiting_for_the_simulator_yields_no_batch():
    imagined = CountingSource("imagined")
    mixer = SourceMixer(4, 2)
    assert mixer.take(lambda n: None, imagined) is None
    assert imagined.calls == [] and mixer.consumed == {"sim": 0, "imagined": 0}


def test_metrics_are_split_by_source():
    batch = [seg("sim", behavior_version=3, reward=1.0), seg("sim", behavior_version=5, reward=3.0),
             seg("imagined", behavior_version=4, reward=-1.0, wm_version=20)]
    m = SourceMixer(3, 1).metrics(batch, learner_version=6)
    # staleness = 6 - behavior_version per decision: sim (3, 3, 1, 1) -> 2.0; imagined (2, 2) -> 2.0 + 0
    assert m["staleness/mean/sim"] == 2.0 and m["staleness/mean/imagined"] == 2.0
    assert m["learner/reward_mean/sim"] == 2.0 and m["learner/reward_mean/imagined"] == -1.0
    assert m["queue/imagined_frac"] == pytest.approx(1 / 3) and m["wm/consumed_version_mean"] == 20.0


def test_gate_shift_keeps_simulator_producers_running_while_imagination_is_absent():
    """No imagined segment ever arrives: every batch is all simulator. Without shifting, the sim gate (which assumed
    n_sim = 1 per batch) predicts ever later consumption and pauses its producers for good; with shifting it keeps
    admitting and the staleness it predicted holds."""
    b, n_imagined, steps, max_staleness = 2, 1, 1, 2
    for shift in (False, True):
        sim_gate = StalenessGate(b - n_imagined, steps, max_staleness)
        imagined_gate = StalenessGate(n_imagined, steps, max_staleness)

        def on_shortfall(n, sim_gate=sim_gate, imagined_gate=imagined_gate):
            sim_gate.shift(-n)
            imagined_gate.shift(n)
        queue, version, denied_rounds = RolloutQueue(16), 0, 0
        mixer = SourceMixer(b, n_imagined, on_shortfall=on_shortfall if shift else None)
        for _ in range(30):
            admitted = 0
            while len(queue) < queue.capacity and sim_gate.try_acquire(0, 0, version):
                queue.put(seg("sim", behavior_version=version))
                admitted += 1
            denied_rounds += admitted == 0
            if len(queue) < b:
                break  # producers wait for fresher weights that can never come: deadlock
            batch = mixer.take(queue.get_batch, lambda n: [])
            assert max(version - int(s.behavior_version.max()) for s in batch) <= max_staleness
            version += steps
        if shift:
            assert version == 30 and mixer.shortfall == 30
        else:
            assert version < 30, "without the shift the sim producers should stall"


def test_local_batches_never_wait_for_imagination():
    from acce.runtime.imagination import LocalImagination
    cfg = load(None, ["imagination.num_workers=1", "imagination.imagined_fraction=0.5", "learner.batch_segments=4",
                      "runtime.kind=local", "env.image_size=64"])
    local = LocalImagination(cfg, server=None, make_imagined_env=None, make_wm_trainer=None)
    sim_queue = RolloutQueue(8)
    for _ in range(3):
        sim_queue.put(seg("sim"))
    assert local.take_batch(sim_queue) is None  # 3 < 4 sim segments and nothing imagined: not ready, no wait
    local.queue.put(seg("imagined"))
    batch = local.take_batch(sim_queue)
    assert [s.source for s in batch].count("imagined") == 1 and len(batch) == 4 and local.mixer.shortfall == 1


@pytest.mark.parametrize("overrides, match", [
    (["imagination.num_workers=1"], "contradict"),
    (["imagination.imagined_fraction=0.5"], "contradict"),
    (["imagination.num_workers=1", "imagination.imagined_fraction=1.0"], r"\[0, 1\)"),
    (["imagination.num_workers=1", "imagination.imagined_fraction=0.01"], "raise learner.batch_segments"),
    (["imagination.num_workers=1", "imagination.imagined_fraction=0.5", "runtime.mode=sync"], "mode=async"),
    (["imagination.num_workers=1", "imagination.imagined_fraction=0.5", "env.image_size=32"], "wm.image_size"),
    (["imagination.num_workers=1", "imagination.imagined_fraction=0.5", "imagination.record_fraction=0"],
     "record_fraction"),
    (["imagination.num_wokers=1"], "did you mean 'imagination.num_workers'"),
])
def test_bad_imagination_config_gets_one_error_naming_the_fix(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load(None, overrides)


def test_imagination_is_off_by_default_and_presets_are_unchanged():
    for path in (None, "configs/debug.yaml", "configs/default.yaml"):
        assert not load(path).imagination.enabled
    cfg = load("configs/debug_wm.yaml")
    assert cfg.imagination.enabled and cfg.imagination.imagined_per_batch(cfg.learner.batch_segments) == 1


def test_an_imagined_segment_too_stale_for_the_learner_is_dropped_counted_and_its_slot_filled_from_the_simulator():
    """The learner does not wait for imagination: a segment whose production outlasted several updates arrives staler
    than its gate predicted. At version 10 with max_staleness 4, behavior versions 5 (stale by 5) and 7 (by 3)."""
    shortfalls, stale = [], []
    sim = CountingSource("sim")
    waiting = [seg("imagined", behavior_version=5), seg("imagined", behavior_version=7)]
    mixer = SourceMixer(8, 3, on_shortfall=shortfalls.append, max_staleness=4, on_stale=stale.append)
    batch = mixer.take(sim, lambda n: [waiting.pop(0) for _ in range(min(n, len(waiting)))], version=10)
    assert sim.calls == [5, 2]  # one slot short (2 waiting for 3) and one dropped: both from the simulator
    assert len(batch) == 8 and [int(s.behavior_version[0]) for s in batch if s.source == "imagined"] == [7]
    assert shortfalls == [1] and stale == [1] and mixer.shortfall == 1 and mixer.dropped_stale == 1
    assert mixer.metrics(batch, 10)["queue/imagined_dropped_stale"] == 1
    # without a version (the local runtime) nothing is dropped: the learner's own exclusion stays the net
    waiting[:] = [seg("imagined", behavior_version=5)]
    batch = SourceMixer(8, 1, max_staleness=4).take(sim, lambda n: [waiting.pop(0)])
    assert [int(s.behavior_version[0]) for s in batch if s.source == "imagined"] == [5]
