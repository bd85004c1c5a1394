"""The off-policy residual learner (learner.algorithm=td3): transitions from semi-Markov segments, the TD target,
checkpoints, config checks. Its learning test is in test_rl_learning.py."""
import numpy as np
import pytest
import torch
from torch import nn

from acce.configlib import ConfigError
from acce.config import load
from acce.runtime.learner import collate
from acce.runtime.offpolicy import OffPolicyLearner, part
from test_learner import make_learner, segment  # noqa: E402

TD3 = ["learner.algorithm=td3", "learner.train_scope=residual", "policy.residual_hidden=8", "learner.utd=1",
       "learner.td3_batch=4", "learner.max_staleness=-1"]


def td3_learner(extra=()):
    cfg, base = make_learner([*TD3, *extra])
    learner = OffPolicyLearner(base.policy, cfg.learner)
    return cfg, learner


class Const(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c

    def forward(self, s, lang, chunk, mask):
        return torch.full((s.shape[0],), float(self.c))


class Learned(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Parameter(torch.zeros(()))

    def forward(self, s, lang, chunk, mask):
        return self.c.expand(s.shape[0])


def test_transitions_pair_each_decision_with_the_state_after_it():
    _, learner = td3_learner()
    seg_a = segment([1.0, 1.0, 0.0, 1.0])  # two decisions of span 2, then the bootstrap row (state 99)
    seg_b = segment([1.0, 1.0, 0.0, 1.0], truncate_last=True)  # ... truncated: bootstrap = the final observation
    data = collate([seg_a, seg_b])
    tr = learner._transitions(data)
    np.testing.assert_allclose(tr["reward"].numpy(), [1.9, 0.9, 1.9, 0.9], rtol=1e-6)
    np.testing.assert_allclose(tr["discount"].numpy(), [0.81] * 4, rtol=1e-6)  # truncation still bootstraps
    # decision 0's next state is decision 1 of its segment; decision 1's is the segment's bootstrap row
    torch.testing.assert_close(tr["n/state"][0], tr["s/state"][1])
    torch.testing.assert_close(tr["n/h_action"][2], tr["s/h_action"][3])
    def normalized(raw):
        return ((torch.tensor([raw]) - learner.policy.state_mean) / learner.policy.state_std).reshape(-1)
    torch.testing.assert_close(tr["n/state"][1], normalized(float(seg_a.bootstrap["state"][0, 0])))
    torch.testing.assert_close(tr["n/state"][3], normalized(99.0))  # the truncated episode's final observation
    assert tr["n/mask"][0].tolist() == tr["mask"][1].tolist()
    assert tr["n/mask"][1].tolist() == [True, True, False, False, False, False]  # delay 0, span 2 at the boot row
    assert "n/lang" not in tr  # the next state shares the instruction


def test_td_target_is_reward_plus_discounted_min_of_the_target_heads():
    _, learner = td3_learner(["learner.value_warmup_updates=100"])
    data = collate([segment([1.0, 1.0, 0.0, 1.0])])
    learner.update([segment([1.0, 1.0, 0.0, 1.0])])  # builds the Q heads
    learner.q = nn.ModuleList([Learned(), Learned()])
    learner.q_target = nn.ModuleList([Const(1.0), Const(3.0)])
    learner.q_optimizer = torch.optim.SGD(learner.q.parameters(), lr=0.0)
    stats = learner._critic_step(learner._transitions(data))
    # y = r + discount * min(1, 3) = [1.9 + 0.81, 0.9 + 0.81]; Q = 0: per-head loss mean(2.71^2, 1.71^2)
    assert stats["learner/td_target_mean"] == pytest.approx((2.71 + 1.71) / 2, rel=1e-5)
    assert stats["loss/value"] == pytest.approx((2.71 ** 2 + 1.71 ** 2) / 2, rel=1e-5)


def test_critic_only_updates_leave_the_actor_untouched_and_versions_count_steps():
    _, learner = td3_learner(["learner.value_warmup_updates=2"])
    before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    stats = learner.update([segment([1.0, 1.0, 0.0, 1.0]), segment([0.0, 1.0, 1.0, 1.0])])
    assert learner.version == 4 == stats["learner/gradient_steps"]  # utd 1 x 4 decisions
    assert all(torch.equal(v, learner.policy.state_dict()[k]) for k, v in before.items())
    learner.update([segment([1.0, 1.0, 0.0, 1.0])])
    learner.update([segment([1.0, 1.0, 0.0, 1.0])])  # the third update trains the residual
    moved = [k for k, v in before.items() if not torch.equal(v, learner.policy.state_dict()[k])]
    assert moved and all(k.startswith("residual.") for k in moved), moved
    assert {n for n, p in learner.policy.named_parameters() if p.requires_grad} == \
        {n for n, _ in learner.policy.named_parameters() if n.startswith("residual.")}


def test_checkpoint_round_trip_keeps_the_q_heads():
    _, learner = td3_learner()
    seg = segment([1.0, 1.0, 0.0, 1.0])
    learner.update([seg])
    state = learner.state_dict()
    _, fresh = td3_learner()
    fresh.load_state_dict(state)
    assert fresh.state_dict()["td3"]["critic_steps"] == learner.critic_steps  # kept until the heads are rebuilt
    tr = fresh._transitions(collate([seg]))
    fresh._build_q(part(tr, "s"), tr["mask"].shape[1],
                   tr["chunk"].shape[-1])
    for a, b in zip(learner.q.state_dict().values(), fresh.q.state_dict().values()):
        torch.testing.assert_close(a, b)
    for a, b in zip(learner.q_target.state_dict().values(), fresh.q_target.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_td3_needs_the_residual_scope():
    with pytest.raises(ConfigError, match="train_scope=residual"):
        load(None, ["learner.algorithm=td3"])
    with pytest.raises(ConfigError, match="utd"):
        load(None, [*TD3, "learner.utd=0"])
