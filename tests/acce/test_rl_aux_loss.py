"""learner.aux_coef: the aux head keeps learning the rollouts' privileged labels during RL (train_scope=all), with
the standardization cloning used, which the policy keeps and saves (VLAPolicy.set_aux_norm)."""
import numpy as np
import pytest
import torch

from acce.algo.losses import aux_regression_loss
from acce.checkpoint import policy_for_rl
from acce.config import load
from acce.configlib import ConfigError
from acce.policy.norm import NormStats
from acce.policy.vla import VLAPolicy
from acce.runtime.learner import Learner, collate
from test_learner import segment  # noqa: E402  (tests/acce is on sys.path under pytest's rootdir import mode)

MEAN, STD = np.array([0.1, -0.2], np.float32), np.array([0.5, 2.0], np.float32)


def test_aux_regression_loss_by_hand():
    # targets ((0.6 - 0.1) / 0.5, (1.8 + 0.2) / 2) = (1, 1); errors (0 - 1)^2 = 1 and (3 - 1)^2 = 4 -> mean 2.5
    pred = torch.tensor([[0.0, 3.0]], requires_grad=True)
    loss = aux_regression_loss(pred, np.array([[0.6, 1.8]], np.float32), MEAN, STD)
    assert loss.item() == pytest.approx(2.5)
    loss.backward()
    assert pred.grad[0].tolist() == pytest.approx([-1.0, 2.0])  # d/dpred of mean over 2 of (pred - t)^2 = pred - t
    with pytest.raises(ValueError, match="policy.critic=privileged"):
        aux_regression_loss(pred, None, MEAN, STD)


def test_aux_coef_needs_the_full_scope():
    with pytest.raises(ConfigError, match="train_scope=all"):
        load(None, ["learner.aux_coef=1.0", "learner.train_scope=residual"])
    with pytest.raises(ConfigError, match="aux_coef must be >= 0"):
        load(None, ["learner.aux_coef=-1"])


def make(overrides=(), norm=True):
    cfg = load(None, ["policy.language=hash", "policy.resnet_hidden_sizes=[8,16,32]", "policy.image_grid=2",
                      "policy.trunk_width=32", "policy.trunk_layers=1", "policy.trunk_heads=2",
                      "policy.max_delay_steps=2", "policy.chunk_len=6", "policy.critic=privileged", "learner.lr=3e-3",
                      "learner.epochs=1", "learner.minibatches=1", "learner.value_warmup_updates=100", *overrides])
    torch.manual_seed(0)
    policy = VLAPolicy(cfg.policy, 1, 2, NormStats.from_states(np.zeros((4, 1), np.float32)), aux_dim=2,
                       privileged_dim=2)
    if norm:
        policy.set_aux_norm(MEAN, STD)
    return policy, Learner(policy, cfg.learner)


def labelled(seed):
    seg = segment([1.0, 0.0, 0.5, 0.0, 0.0, 1.0], version=0)
    rng = np.random.default_rng(seed)
    seg.obs["aux"] = rng.uniform(-1, 1, (len(seg), 2)).astype(np.float32)
    seg.bootstrap["aux"] = rng.uniform(-1, 1, (len(seg.bootstrap["state"]), 2)).astype(np.float32)
    return seg


@pytest.mark.parametrize("coef", [0.0, 1.0])
def test_rl_trains_the_aux_head_on_rollout_labels_only_when_asked(coef):
    policy, learner = make([f"learner.aux_coef={coef}"])
    segs = [labelled(0), labelled(1)]
    head = [p.detach().clone() for p in policy.aux_head.parameters()]

    def aux_error():
        batch = policy.with_lang(collate(segs)["inputs"])
        with torch.no_grad():
            return aux_regression_loss(policy(batch, return_aux=True)[3], batch["aux"], MEAN, STD).item()
    before = aux_error()
    metrics = [learner.update(segs) for _ in range(15)]
    moved = any(not torch.equal(a, b) for a, b in zip(head, policy.aux_head.parameters()))
    if coef:
        assert "loss/aux" in metrics[0] and aux_error() < 0.5 * before and moved
    else:  # no aux term (value warm-up keeps the actor still, so nothing else reaches the aux head)
        assert "loss/aux" not in metrics[0] and not moved


def test_aux_statistics_travel_with_the_policy_and_are_required():
    policy, _ = make()
    for loaded in (VLAPolicy.from_state(policy.policy_state()),
                   policy_for_rl(policy.policy_state(), load(None, ["policy.critic=privileged",
                                                                    "policy.residual_hidden=16"]).policy, 2)):
        assert all(np.array_equal(a, b) for a, b in zip(loaded.aux_norm, (MEAN, STD)))
    with pytest.raises(ValueError, match=r"\(2,\) with std > 0"):
        policy.set_aux_norm([0.0], [1.0])
    _, learner = make(["learner.aux_coef=1.0"], norm=False)  # a warm start cloned before the statistics were kept
    with pytest.raises(ValueError, match="clone it again"):
        learner.update([labelled(0)])
