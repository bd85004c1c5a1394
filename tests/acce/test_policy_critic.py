"""The asymmetric critic (policy.critic=privileged): it reads obs["aux"], the actor never does, and everything that
has no privileged state (evaluation, serving, robots) still runs."""
import dataclasses

import numpy as np
import pytest
import torch

from acce.configlib import ConfigError
from acce.config import load
from acce.policy import VLAPolicy

from test_policy import A, CFG, NORM, S, make_batch, with_prefix

PRIV = dataclasses.replace(CFG, critic="privileged")


def make_priv(seed=0):
    torch.manual_seed(seed)
    return VLAPolicy(PRIV, S, A, NORM, privileged_dim=4)


def test_privileged_value_reads_aux_and_the_actor_never_does():
    policy = make_priv()
    batch = with_prefix(make_batch(policy), [0, 1, 2])
    aux = np.random.default_rng(0).uniform(-0.2, 0.2, (3, 4)).astype(np.float32)
    mean, log_std, value = policy({**batch, "aux": aux})
    mean2, log_std2, value2 = policy({**batch, "aux": aux + 0.1})
    mean0, _, value0 = policy(batch)  # no privileged state: the actor is unchanged, the value a placeholder 0
    assert torch.equal(mean, mean2) and torch.equal(mean, mean0) and torch.equal(log_std, log_std2)
    assert not torch.allclose(value, value2)
    assert torch.equal(value0, torch.zeros(3))
    loaded = VLAPolicy.from_state(policy.policy_state())
    assert loaded.privileged_dim == 4
    assert torch.equal(loaded({**batch, "aux": aux})[2], value)
    with pytest.raises(ValueError, match="aux"):
        policy({**batch, "aux": aux[:, :2]})  # wrong width: one clear error


def test_privileged_critic_config_checks():
    with pytest.raises(ValueError, match="privileged_dim"):
        VLAPolicy(PRIV, S, A, NORM)
    with pytest.raises(ConfigError, match="recompute_values"):
        load(None, ["policy.critic=privileged", "learner.recompute_values=false"])
    with pytest.raises(ConfigError, match="policy.critic must be"):
        load(None, ["policy.critic=oracle"])


def test_warm_start_gets_the_critic_rl_asks_for():
    """train.init_from with policy.critic=privileged: actor weights as saved, a fresh privileged value head."""
    from acce.checkpoint import policy_for_rl
    from test_policy import make_policy
    trunk = make_policy()
    policy = policy_for_rl(trunk.policy_state(), dataclasses.replace(CFG, critic="privileged"), 4)
    batch = with_prefix(make_batch(trunk), [0, 2, 1])
    assert policy.config.critic == "privileged" and policy.privileged_dim == 4
    assert torch.equal(policy(batch)[0], trunk(batch)[0])
    assert policy_for_rl(trunk.policy_state(), CFG, 0).config.critic == "trunk"
    # an RL residual on top: zero at start, so version 0 still acts exactly as the warm start
    res = policy_for_rl(trunk.policy_state(), dataclasses.replace(CFG, residual_hidden=16), 0)
    assert res.config.residual_hidden == 16 and torch.equal(res(batch)[0], trunk(batch)[0])


def test_evaluation_needs_no_privileged_state():
    """A privileged-critic policy evaluates on envs that provide no obs['aux'] (what a robot gives it)."""
    from acce.serving.inference import InferenceServer
    from acce.wiring import make_evaluator
    from acce.train import build_policy
    cfg = load("configs/debug.yaml", ["policy.critic=privileged", "eval.num_envs=2"])
    policy = build_policy(cfg, np.zeros((8, 7), np.float32))
    results = make_evaluator(cfg, InferenceServer(policy, deterministic=True), ["reach"], 2).run("val")
    assert results["per_task"]["reach/val"]["n"] == 2


def test_residual_reads_the_aux_estimate():
    """policy.residual_reads_aux: the RL residual's input includes the aux head's object/goal estimate (its weights
    on those inputs get gradient), it still starts at zero, and turning it off restores the old input width."""
    cfg = dataclasses.replace(CFG, keypoints=4, aux_from="keypoints", aux_input=True, residual_hidden=8)
    torch.manual_seed(0)
    policy = VLAPolicy(cfg, S, A, NORM, aux_dim=4)
    width = cfg.trunk_width
    assert policy.residual[0].in_features == width + S + 4
    batch = with_prefix(make_batch(policy), [0, 1, 2])
    base = VLAPolicy(dataclasses.replace(cfg, residual_hidden=0), S, A, NORM, aux_dim=4)
    base.load_state_dict({k: v for k, v in policy.state_dict().items() if not k.startswith("residual.")})
    assert torch.equal(policy(batch)[0], base(batch)[0])  # zero-initialised: version 0 acts as the warm start
    torch.nn.init.normal_(policy.residual[-1].weight)
    policy(batch)[0].sum().backward()
    assert policy.residual[0].weight.grad[:, width + S:].abs().sum() > 0  # the aux columns carry gradient
    off = VLAPolicy(dataclasses.replace(cfg, residual_reads_aux=False), S, A, NORM, aux_dim=4)
    assert off.residual[0].in_features == width + S


def test_residual_reads_the_instruction_embedding():
    """policy.residual_reads_lang: the residual's input includes the instruction embedding (those weights get
    gradient, and two instructions on the same frames get different corrections), it still starts at zero, and a
    warm start saved without it gains it through policy_for_rl (train.init_from) acting as before."""
    from acce.checkpoint import policy_for_rl
    cfg = dataclasses.replace(CFG, residual_hidden=8, residual_reads_lang=True)
    torch.manual_seed(0)
    policy = VLAPolicy(cfg, S, A, NORM)
    width = cfg.trunk_width
    assert policy.residual[0].in_features == width + S + cfg.lang_dim
    batch = with_prefix(make_batch(policy), [0, 1, 2])
    base = VLAPolicy(dataclasses.replace(cfg, residual_hidden=0, residual_reads_lang=False), S, A, NORM)
    base.load_state_dict({k: v for k, v in policy.state_dict().items() if not k.startswith("residual.")})
    assert torch.equal(policy(batch)[0], base(batch)[0])  # zero-initialised: version 0 acts as the warm start
    torch.nn.init.normal_(policy.residual[-1].weight)
    policy(batch)[0].sum().backward()
    assert policy.residual[0].weight.grad[:, width + S:].abs().sum() > 0  # the instruction columns carry gradient
    with torch.no_grad():  # same frames and trunk output, another instruction: only the lang columns differ
        f = policy.features(batch)
        other = {**f, "lang": torch.roll(f["lang"], 1, dims=0)}
        assert not torch.allclose(policy.heads(f)[0], policy.heads(other)[0])
        off = VLAPolicy(dataclasses.replace(cfg, residual_reads_lang=False), S, A, NORM)
        torch.nn.init.normal_(off.residual[-1].weight)  # a non-zero residual that does not read the instruction
        g = off.features(batch)
        assert torch.equal(off.heads(g)[0], off.heads({**g, "lang": torch.roll(g["lang"], 1, dims=0)})[0])
    warm = VLAPolicy(dataclasses.replace(cfg, residual_reads_lang=False), S, A, NORM)
    rl = policy_for_rl(warm.policy_state(), cfg, 0)
    assert rl.config.residual_reads_lang and rl.residual[0].in_features == width + S + cfg.lang_dim
    with torch.no_grad():
        assert torch.equal(rl(batch)[0], warm(batch)[0])


def test_privileged_value_needs_no_vision_or_trunk_and_equals_the_forward_pass():
    """The learner's bootstrap rows take this path: the same values, bit for bit, without the expensive part."""
    policy = make_priv()
    batch = with_prefix(make_batch(policy), [0, 1, 2])
    batch = {**batch, "aux": np.random.default_rng(1).uniform(-0.2, 0.2, (3, 4)).astype(np.float32)}
    vision_calls = []
    policy.vision.register_forward_hook(lambda m, inp, out: vision_calls.append(1))
    with torch.no_grad():
        cheap = policy.value(policy.features_from(batch, {}))
        assert not vision_calls
        full = policy(batch)[2]
    assert torch.equal(cheap, full) and vision_calls
