"""Online thresholds for the world model's done heads (imagination.wm_calibrate_frames, worldmodel.calibration)."""
import numpy as np
import pytest
import torch
from wm_helpers import fake_episode, tiny_model

from acce.config import load
from acce.configlib import ConfigError
from worldmodel.calibration import (Calibrator, best_f1_threshold, count_matching_threshold, counts_at_thresholds,
                                   one_step_logits)
from worldmodel.data import from_episode
from worldmodel.model import WorldModel
from worldmodel.trainer import WorldModelTrainer

IMAGINATION = ["imagination.num_workers=1", "imagination.imagined_fraction=0.5", "env.image_size=32"]


def _arrays(n, seed0=0, steps=6):
    return [from_episode(fake_episode(steps, seed0 + k), ("front",)) for k in range(n)]


@pytest.mark.parametrize("logits, label, threshold, f1", [
    # cuts after 3 / 2 / 1 / 0 / -1 give F1 2/3, 1/2, 4/5, 2/3, 4/7: the best calls {3, 1} (and 2) positive
    ([3, 2, 1, 0, -1], [1, 0, 1, 0, 0], 0.5, 0.8),
    ([1, 1, 0], [1, 0, 0], 0.5, 2 / 3),      # tied logits are one cut
    ([2, 1], [1, 1], 0.5, 1.0),              # everything positive: half a unit under the lowest logit
    ([0.2, -0.4, 5.0], [0, 1, 1], -0.9, 0.8),  # unsorted input; calling all three positive scores best
])
def test_best_f1_threshold_by_hand(logits, label, threshold, f1):
    got_t, got_f1 = best_f1_threshold(np.array(logits, float), np.array(label, bool))
    assert got_t == pytest.approx(threshold) and got_f1 == pytest.approx(f1)


def test_counts_at_thresholds_by_hand():
    # logit >= 2: {0} -> tp 1, fp 0; >= 1: {0, 1, 2} -> tp 2, fp 1; >= 0: all -> tp 2, fp 2 (ties share one point)
    values, tp, fp = counts_at_thresholds(np.array([2.0, 1.0, 1.0, 0.0]), np.array([True, False, True, False]))
    assert values.tolist() == [2.0, 1.0, 0.0] and tp.tolist() == [1, 2, 2] and fp.tolist() == [0, 1, 2]


@pytest.mark.parametrize("logits, label, threshold", [
    ([3, 2, 1, 0, -1], [1, 0, 1, 0, 0], 1.5),  # 2 positives: the cut between the 2nd (2) and 3rd (1) largest
    ([0.2, -0.4, 5.0], [0, 1, 0], 2.6),         # 1 positive, unsorted: between 5.0 and 0.2
    ([2, 1], [1, 1], 0.0),                      # everything positive: one unit under the lowest logit
    ([1, 1, 0], [1, 0, 0], 1.0),                # tied at the cut: both called negative (logit > 1 is false)
])
def test_count_matching_threshold_by_hand(logits, label, threshold):
    assert count_matching_threshold(np.array(logits, float), np.array(label, bool)) == pytest.approx(threshold)


def test_the_count_rule_calls_as_many_successes_as_the_window_holds():
    model, eps = _drifted_model(), _arrays(12)
    Calibrator(frames=1000, rule="count").observe(model, eps)
    logits = np.concatenate([one_step_logits(model, ep) for ep in eps])[:, 1]
    assert (logits > float(model.done_threshold[1])).sum() == 12 and float(model.done_threshold[1]) < -10
    with pytest.raises(ValueError, match="rule must be one of"):
        Calibrator(frames=10, rule="auc")


def test_best_f1_threshold_needs_a_positive():
    with pytest.raises(ValueError, match="at least one positive"):
        best_f1_threshold(np.zeros(3), np.zeros(3, bool))


def _drifted_model():
    """A success head whose logits all sit far below 0: logit > 0 calls nothing, but the ranking is untouched."""
    model = tiny_model()
    with torch.no_grad():
        model.done_head[-1].bias[1] -= 20.0
    return model


def test_calibration_follows_a_drifted_head():
    model, eps = _drifted_model(), _arrays(12)
    logits = np.concatenate([one_step_logits(model, ep) for ep in eps])
    labels = np.concatenate([ep.success for ep in eps])
    assert not (logits[:, 1] > 0).any() and labels.sum() == 12
    cal = Calibrator(frames=1000)
    cal.observe(model, eps)
    threshold, f1 = best_f1_threshold(logits[:, 1], labels)
    assert float(model.done_threshold[1]) == pytest.approx(threshold, abs=1e-5) and cal.f1[1] == pytest.approx(f1)
    assert threshold < -10 and f1 > 0
    z = model.encode({"image/front": eps[0].images[:3], "state": eps[0].state[:3], "instruction": ["x"] * 3})
    flags, raw = model.done_flags(z), model.done_logits(z)
    assert torch.equal(flags, raw > model.done_threshold)


def test_window_keeps_the_last_frames_and_waits_for_positives():
    model = _drifted_model()
    cal = Calibrator(frames=20)
    cal.observe(model, _arrays(3))  # 3 positives: fewer than 5, thresholds stay
    assert cal.window_frames == 18 and torch.equal(model.done_threshold, torch.zeros(2))
    cal.observe(model, _arrays(2, seed0=3))  # 30 frames: the oldest episode leaves, 24 >= 20 stay, 4 positives
    assert cal.window_frames == 24 and torch.equal(model.done_threshold, torch.zeros(2))
    cal.observe(model, _arrays(2, seed0=5))  # 36 -> 24 frames, still 4 positives
    assert cal.window_frames == 24 and float(model.done_threshold[1]) == 0.0
    cal2 = Calibrator(frames=60)
    cal2.observe(model, _arrays(6))
    assert float(model.done_threshold[1]) < -10  # both heads fitted once 5 positives are in


def test_trainer_scores_episodes_before_training_on_them_and_publishes_the_thresholds():
    trainer = WorldModelTrainer(_drifted_model(), seed=0)
    trainer.set_calibration(200)
    eps = _arrays(8)
    expected = best_f1_threshold(np.concatenate([one_step_logits(trainer.model, ep)[:, 1] for ep in eps]),
                                 np.concatenate([ep.success for ep in eps]))[0]
    trainer.add_arrays(eps)  # scored with the weights from before any step on them
    assert float(trainer.model.done_threshold[1]) == pytest.approx(expected, abs=1e-5)
    metrics = trainer.train_steps(2)
    assert metrics["wm/threshold/success"] == pytest.approx(expected, abs=1e-5)
    assert metrics["wm/calibration_frames"] == 48
    _, state = trainer.publish()
    assert float(state["done_threshold"][1]) == pytest.approx(expected, abs=1e-5)
    plain = WorldModelTrainer(_drifted_model(), seed=0)
    plain.add_arrays(_arrays(8))
    assert torch.equal(plain.model.done_threshold, torch.zeros(2)) and "wm/threshold/success" not in \
        plain.train_steps(1)


def test_checkpoints_keep_thresholds_and_old_ones_load_with_zero(tmp_path):
    model = tiny_model()
    model.done_threshold[1] = -2.5
    model.save(tmp_path / "wm.pt")
    assert float(WorldModel.load(tmp_path / "wm.pt").done_threshold[1]) == -2.5
    payload = torch.load(tmp_path / "wm.pt", weights_only=True)
    del payload["state_dict"]["done_threshold"]  # written before thresholds existed
    torch.save(payload, tmp_path / "old.pt")
    assert torch.equal(WorldModel.load(tmp_path / "old.pt").done_threshold, torch.zeros(2))


def test_the_online_trainer_calibrates_when_the_config_asks(tmp_path):
    from acce import wiring
    tiny_model().save(tmp_path / "wm.pt")
    on = load(None, [*IMAGINATION, f"imagination.wm_init_from={tmp_path / 'wm.pt'}",
                     "imagination.wm_calibrate_frames=500"])
    assert wiring.wm_trainer_factory(on)(fake_episode(5, 0)).calibrator.frames == 500
    off = load(None, [*IMAGINATION, f"imagination.wm_init_from={tmp_path / 'wm.pt'}"])
    assert wiring.wm_trainer_factory(off)(fake_episode(5, 0)).calibrator is None
    rule = load(None, [*IMAGINATION, f"imagination.wm_init_from={tmp_path / 'wm.pt'}",
                       "imagination.wm_calibrate_frames=500", "imagination.wm_calibrate_rule=count"])
    assert wiring.wm_trainer_factory(rule)(fake_episode(5, 0)).calibrator.rule == "count"
    with pytest.raises(ConfigError, match="wm_calibrate_rule must be f1 or count"):
        load(None, [*IMAGINATION, "imagination.wm_calibrate_rule=mean"])
    with pytest.raises(ConfigError, match="wm_calibrate_frames must be >= 0"):
        load(None, [*IMAGINATION, "imagination.wm_calibrate_frames=-1"])
