"""The policy's perception auxiliary head: which features it reads, instruction-conditioned keypoints, and its
estimate feeding the state token (bc.aux_loss_coef, policy.aux_from / aux_layer / aux_input)."""
import dataclasses

import pytest
import torch

from acce.configlib import ConfigError
from acce.policy import VLAPolicy

# Shared helpers; pytest puts this directory on sys.path (rootdir import mode, no __init__.py in tests/).
from test_policy import A, CFG, NORM, S, make_batch, make_policy, with_prefix


@pytest.mark.parametrize("aux_layer", [-1, 0])
def test_aux_head_predicts_from_the_action_query_and_round_trips(aux_layer):
    cfg = dataclasses.replace(CFG, trunk_layers=2, aux_layer=aux_layer, mean_hidden=16)
    torch.manual_seed(0)
    policy = VLAPolicy(cfg, S, A, NORM, aux_dim=4)
    batch = with_prefix(make_batch(policy), [0, 1, 2])
    mean, log_std, value, aux = policy(batch, return_aux=True)
    assert aux.shape == (3, 4)
    for x, y in zip((mean, log_std, value), policy(batch)):  # asking for aux changes nothing else
        assert torch.equal(x, y)
    # the head reads the chosen layer: perturbing only the last layer changes aux only when it reads the last one
    with torch.no_grad():
        dense = policy.trunk.encoder.layer[-1].output.dense
        dense.weight.add_(torch.randn_like(dense.weight))
    changed = not torch.allclose(policy(batch, return_aux=True)[3], aux)
    assert changed == (aux_layer == -1)
    loaded = VLAPolicy.from_state(policy.policy_state())
    assert loaded.aux_dim == 4
    for x, y in zip(policy(batch, return_aux=True), loaded(batch, return_aux=True)):
        assert torch.equal(x, y)
    plain = make_policy()
    with pytest.raises(ValueError, match="no aux head"):
        plain(make_batch(plain), return_aux=True)
    assert "aux" not in str(plain.policy_state()["state_dict"].keys())
    with pytest.raises(ConfigError, match="aux_layer"):
        dataclasses.replace(CFG, aux_layer=1)  # CFG has one trunk layer


def test_keypoint_aux_reads_instruction_conditioned_keypoints():
    cfg = dataclasses.replace(CFG, keypoints=3, aux_from="keypoints")
    torch.manual_seed(0)
    policy = VLAPolicy(cfg, S, A, NORM, cameras=("front", "wrist"), aux_dim=4)
    with torch.no_grad():  # a visible FiLM (the init is near-identity)
        policy.keypoint_film[1].weight.normal_(std=0.5)
    batch = make_batch(policy, cameras=("front", "wrist"))
    aux = policy(batch, return_aux=True)[3]
    assert aux.shape == (3, 4)
    other = {**batch, "lang": policy.embed(["another instruction"] * 3)}
    assert not torch.allclose(policy(other, return_aux=True)[3], aux)  # where to look depends on the instruction
    with torch.no_grad():  # the aux head sees only keypoints: zeroing the trunk's query changes nothing in it
        policy.queries.zero_()
    torch.testing.assert_close(policy(batch, return_aux=True)[3], aux)
    with pytest.raises(ConfigError, match="needs policy.keypoints"):
        dataclasses.replace(CFG, aux_from="keypoints")


def test_aux_input_feeds_the_predicted_positions_into_the_state_token():
    cfg = dataclasses.replace(CFG, keypoints=3, aux_from="keypoints", aux_input=True)
    torch.manual_seed(0)
    policy = VLAPolicy(cfg, S, A, NORM, aux_dim=4)
    assert policy.state_proj.in_features == S + 4
    batch = make_batch(policy)
    mean = policy(batch)[0]
    torch.testing.assert_close(policy(batch, return_aux=True)[0], mean)
    with torch.no_grad():
        policy.aux_head[-1].bias.add_(1.0)  # a different position estimate -> a different action
    assert not torch.allclose(policy(batch)[0], mean)
    loaded = VLAPolicy.from_state(policy.policy_state())
    torch.testing.assert_close(loaded(batch)[0], policy(batch)[0])
    with pytest.raises(ConfigError, match="aux_input needs policy.aux_from=keypoints"):
        dataclasses.replace(CFG, aux_input=True)
    with pytest.raises(ValueError, match="aux_input needs a policy with aux targets"):
        VLAPolicy(cfg, S, A, NORM)
