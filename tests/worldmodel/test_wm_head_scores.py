"""worldmodel.evaluate.head_scores: the done heads' precision/recall at logit > 0 and threshold-free AUROC / AP."""
import numpy as np
import pytest

from worldmodel.evaluate import head_scores


def test_hand_computed_scores():
    # logits 2, 1, 0.5, -1 for labels T, F, T, F. At logit > 0 three are predicted: tp 2, fp 1. AUROC: of the four
    # positive/negative pairs, 0.5 loses to 1 and the other three win: 3/4. AP: precision 1 at the first positive
    # (rank 1), 2/3 at the second (rank 3): (1 + 2/3) / 2.
    s = head_scores(np.array([2.0, 1.0, 0.5, -1.0]), np.array([True, False, True, False]))
    assert s["precision"] == pytest.approx(2 / 3) and s["recall"] == 1.0
    assert s["auroc"] == pytest.approx(0.75) and s["average_precision"] == pytest.approx(5 / 6)
    assert (s["positives"], s["n"]) == (2, 4)


def test_ties_count_half_and_share_a_threshold():
    # a positive tied with a negative at 1: that pair counts 1/2, the pair against 0 counts 1 -> AUROC 3/4; the first
    # threshold (1) takes both tied steps: recall 1 at precision 1/2 -> AP 1/2
    s = head_scores(np.array([1.0, 1.0, 0.0]), np.array([True, False, False]))
    assert s["auroc"] == pytest.approx(0.75) and s["average_precision"] == pytest.approx(0.5)


def test_a_miscalibrated_head_ranks_perfectly_with_no_recall():
    # every logit below 0 (nothing predicted), yet each positive outscores each negative
    s = head_scores(np.array([-0.1, -0.2, -3.0, -4.0]), np.array([True, True, False, False]))
    assert s["recall"] == 0.0 and s["precision"] is None
    assert s["auroc"] == 1.0 and s["average_precision"] == 1.0
    # at a calibrated threshold of -1 (imagination.wm_calibrate_frames) the same head calls both positives
    c = head_scores(np.array([-0.1, -0.2, -3.0, -4.0]), np.array([True, True, False, False]), threshold=-1.0)
    assert c["recall"] == 1.0 and c["precision"] == 1.0 and c["threshold"] == -1.0 and c["auroc"] == 1.0


def test_no_positives_or_no_negatives_give_no_threshold_free_score():
    s = head_scores(np.array([0.3, -0.2]), np.array([False, False]))
    assert s["auroc"] is None and s["average_precision"] is None and s["recall"] is None
