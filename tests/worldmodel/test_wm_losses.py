"""The weighted cross-entropy of the terminated/success heads, with hand-computed numbers."""
import math

import pytest
import torch
from wm_helpers import tiny_cfg

from acce.configlib import ConfigError
from worldmodel.losses import done_bce


def test_done_bce_weights_positive_labels_only():
    # logits 0, 0, ln 3, -ln 3 (sigma = 1/2, 1/2, 3/4, 1/4) with labels 1, 0, 1, 0 and pos_weight 4:
    #   positive at sigma 1/2:  4 * -ln(1/2) = 4 ln 2 = 2.7726
    #   negative at sigma 1/2:      -ln(1/2) =   ln 2 = 0.6931
    #   positive at sigma 3/4:  4 * -ln(3/4) = 4 ln(4/3) = 1.1507
    #   negative at sigma 1/4:    -ln(1 - 1/4) = ln(4/3) = 0.2877
    logits = torch.tensor([0.0, 0.0, math.log(3), -math.log(3)])
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0])
    expected = [4 * math.log(2), math.log(2), 4 * math.log(4 / 3), math.log(4 / 3)]
    assert done_bce(logits, labels, 4.0).tolist() == pytest.approx(expected, rel=1e-5)
    # pos_weight 1 is the plain cross-entropy
    assert done_bce(logits, labels, 1.0).tolist() == pytest.approx([math.log(2), math.log(2), math.log(4 / 3),
                                                                    math.log(4 / 3)], rel=1e-5)


def test_done_pos_weight_must_be_positive():
    with pytest.raises(ConfigError, match="done_pos_weight"):
        tiny_cfg(done_pos_weight=0.0)
