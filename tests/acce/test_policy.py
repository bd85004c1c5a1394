"""VLA policy: shapes, Gaussian math against hand numbers, delay-aware input, normalization, state round trips,
input validation. Everything uses language='hash' except the one MiniLM test."""
import copy
import dataclasses
import io
import math
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from acce.configlib import ConfigError, field_docs
from acce.policy import HashEncoder, NormStats, PolicyConfig, VLAPolicy, make_language_encoder

S, A, H, M = 5, 3, 4, 3  # state dim, action dim, chunk length, max delay (small: fast tests)
CFG = PolicyConfig(language="hash", chunk_len=H, max_delay_steps=M, trunk_width=32, trunk_layers=1, trunk_heads=2)
NORM = NormStats(np.zeros(S, np.float32), np.ones(S, np.float32), {"type": "test", "dim": A, "range": [-1, 1]})


def make_policy(seed=0, cfg=CFG, norm=NORM, cameras=("front",)):
    torch.manual_seed(seed)
    return VLAPolicy(cfg, S, A, norm, cameras)


def make_batch(policy, b=3, seed=0, size=64, cameras=("front",)):
    rng = np.random.default_rng(seed)
    batch = {f"image/{c}": rng.integers(0, 256, (b, size, size, 3), dtype=np.uint8) for c in cameras}
    batch["state"] = rng.standard_normal((b, S)).astype(np.float32)
    batch["lang"] = policy.embed([f"task {i % 2}" for i in range(b)])
    return batch


def with_prefix(batch, delay, seed=1):
    b = len(delay)
    prefix = np.random.default_rng(seed).uniform(-1, 1, (b, M, A)).astype(np.float32)
    return {**batch, "prefix": prefix, "delay_steps": np.asarray(delay, np.int64)}


@pytest.fixture(scope="module")
def policy():
    return make_policy()


def test_output_shapes(policy):
    mean, log_std, value = policy(make_batch(policy))
    assert mean.shape == (3, H, A) and log_std.shape == (H, A) and value.shape == (3,)
    out = policy.act(with_prefix(make_batch(policy), [0, 1, 3]))
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        "chunk": (3, H, A), "mean": (3, H, A), "value": (3,), "log_std": (H, A), "logp_steps": (3, H)}
    two = make_policy(cameras=("wrist", "front"))
    assert two.image_keys == ("image/front", "image/wrist") and two.num_image_tokens == 2 * 16
    assert two(make_batch(two, cameras=("front", "wrist")))[0].shape == (3, H, A)


def test_act_sampling_is_seeded_and_deterministic_mode_returns_mean(policy):
    batch = make_batch(policy)
    a = policy.act(batch, generator=torch.Generator().manual_seed(7))
    b = policy.act(batch, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a["chunk"], b["chunk"]) and not torch.equal(a["chunk"], a["mean"])
    det = policy.act(batch, deterministic=True)
    assert torch.equal(det["chunk"], det["mean"])
    full = torch.ones(3, H, dtype=torch.bool)
    torch.testing.assert_close(a["logp_steps"].sum(-1), VLAPolicy.log_prob(a["mean"], a["log_std"], a["chunk"], full))


def test_log_prob_matches_hand_numbers():
    # One position, mean 0, std 1, x = 1, one dim: -0.5 * 1 - 0.5 * log(2π) = -1.4189385.
    one = VLAPolicy.log_prob(torch.zeros(1, 1, 1), torch.zeros(1, 1), torch.ones(1, 1, 1), torch.ones(1, 1).bool())
    assert one.item() == pytest.approx(-1.4189385, abs=1e-6)
    mean = np.array([[[0.0, 0.0], [1.0, -1.0]], [[0.5, 0.5], [0.0, 0.0]]], np.float32)  # (B=2, H=2, A=2)
    log_std = np.log(np.array([[1.0, 0.5], [2.0, 1.0]], np.float32))  # (H, A)
    chunk = np.array([[[1.0, 0.0], [9.0, 9.0]], [[0.0, 1.0], [0.5, -0.5]]], np.float32)
    mask = np.array([[True, False], [True, True]])
    std = np.exp(log_std)
    dens = -0.5 * ((chunk - mean) / std) ** 2 - log_std - 0.5 * np.log(2 * np.pi)  # (B, H, A)
    manual = (dens.sum(-1) * mask).sum(-1)
    # Row 0 by hand: position 0 only: (-0.5 - 0.9189) + (0 + 0.6931 - 0.9189) = -1.6447
    assert manual[0] == pytest.approx(-0.5 - 0.9189385 + math.log(2) - 0.9189385, abs=1e-5)
    got = VLAPolicy.log_prob(*(torch.from_numpy(x) for x in (mean, log_std, chunk, mask)))
    np.testing.assert_allclose(got.numpy(), manual, rtol=1e-6, atol=1e-6)


def test_entropy_formula():
    log_std = torch.tensor([[0.0, 0.0], [math.log(2.0), -1.0]])  # (H=2, A=2)
    mask = torch.tensor([[True, False], [True, True], [False, False]])
    per_dim = 0.5 + 0.5 * math.log(2 * math.pi)  # entropy of N(0, 1) = 1.4189385
    pos0, pos1 = 2 * per_dim, 2 * per_dim + math.log(2.0) - 1.0
    expected = torch.tensor([pos0, pos0 + pos1, 0.0])
    torch.testing.assert_close(VLAPolicy.entropy(log_std, mask), expected)


def test_masked_positions_do_not_affect_log_prob_or_its_gradient():
    mean = torch.randn(2, 3, 2, requires_grad=True)
    log_std = torch.zeros(3, 2, requires_grad=True)
    chunk = torch.randn(2, 3, 2)
    mask = torch.tensor([[True, False, True], [False, False, True]])
    messy = chunk.clone()
    messy[~mask] = torch.tensor([float("nan"), 1e30])  # padding may hold anything
    grads = []
    for c in (chunk, messy):
        lp = VLAPolicy.log_prob(mean, log_std, c, mask)
        grads.append(torch.autograd.grad(lp.sum(), (mean, log_std)))
        assert torch.isfinite(lp).all()
        torch.testing.assert_close(lp, VLAPolicy.log_prob(mean, log_std, chunk, mask))
    for g0, g1 in zip(*grads):
        torch.testing.assert_close(g0, g1)
    assert (grads[0][0][~mask] == 0).all()
    with pytest.raises(ValueError, match="mask must be bool"):
        VLAPolicy.log_prob(mean, log_std, chunk, mask.float())


def test_zero_delay_prefix_is_exactly_the_plain_input(policy):
    batch = make_batch(policy)
    plain = policy(batch)
    delayed = policy(with_prefix(batch, [0, 0, 0]))
    for p, d in zip(plain, delayed):
        assert torch.equal(p, d)
    # The attention mask (not just zeroed inputs) removes the tokens: changing what they would carry changes nothing.
    other = copy.deepcopy(policy)
    with torch.no_grad():
        other.delay_embed.weight.normal_()
        other.prefix_proj.bias.normal_()
    for p, d in zip(plain, other(with_prefix(batch, [0, 0, 0]))):
        assert torch.equal(p, d)
    assert not torch.equal(policy(with_prefix(batch, [1, 1, 1]))[0], other(with_prefix(batch, [1, 1, 1]))[0])


def test_delay_changes_output_and_padding_rows_do_not(policy):
    batch = make_batch(policy)
    plain_mean, _, plain_value = policy(batch)
    mean, _, value = policy(with_prefix(batch, [2, 2, 2]))
    assert not torch.allclose(mean, plain_mean) and not torch.allclose(value, plain_value)
    a = with_prefix(batch, [1, 2, 3], seed=1)
    b = dict(a, prefix=a["prefix"].copy())
    b["prefix"][0, 1:] = np.nan  # rows past d = 1 are padding
    b["prefix"][1, 2:] = 5.0
    for x, y in zip(policy(a), policy(b)):
        assert torch.equal(x, y)


def test_state_normalization_is_applied():
    mean, std = np.arange(S, dtype=np.float32), np.full(S, 2.0, np.float32)
    normed = make_policy(seed=3, norm=NormStats(mean, std))
    raw = make_policy(seed=3)  # same weights, identity statistics
    batch = make_batch(raw)
    pre = dict(batch, state=((batch["state"] - mean) / std).astype(np.float32))
    for x, y in zip(normed(batch), raw(pre)):
        torch.testing.assert_close(x, y)
    assert not torch.allclose(normed(batch)[0], raw(batch)[0])


def test_norm_stats_from_states_and_dict_round_trip():
    states = np.array([[0.0, 1.0], [2.0, 1.0]], np.float32)
    ns = NormStats.from_states(states)
    np.testing.assert_allclose(ns.state_mean, [1.0, 1.0])
    np.testing.assert_allclose(ns.state_std, [1.0, 1e-3])  # a constant dimension gets the floor, not 0
    back = NormStats.from_dict(ns.to_dict())
    assert np.array_equal(back.state_std, ns.state_std) and back.action_repr == ns.action_repr
    with pytest.raises(ValueError, match="malformed"):
        NormStats.from_dict({"state_mean": [0.0], "state_std": [-1.0]})


def test_policy_state_round_trip_gives_identical_outputs(policy):
    buf = io.BytesIO()
    torch.save(policy.policy_state(), buf)
    buf.seek(0)
    rng_before = torch.get_rng_state()
    loaded = VLAPolicy.from_state(torch.load(buf, weights_only=False))
    assert torch.equal(rng_before, torch.get_rng_state())  # loading does not consume the caller's random stream
    batch = with_prefix(make_batch(policy), [0, 2, 3])
    for x, y in zip(policy(batch), loaded(batch)):
        assert torch.equal(x, y)
    assert loaded.config == policy.config and loaded.norm.to_dict() == policy.norm.to_dict()


def test_missing_or_bad_checkpoint_parts_are_errors(policy):
    state = policy.policy_state()
    with pytest.raises(ValueError, match="checkpoint has no normalization statistics"):
        VLAPolicy.from_state({k: v for k, v in state.items() if k != "norm"})
    with pytest.raises(ValueError, match="no normalization statistics"):
        VLAPolicy.from_state({**state, "norm": {"action_repr": {}}})
    with pytest.raises(ValueError, match="malformed"):
        VLAPolicy.from_state({**state, "norm": {"state_mean": [0.0] * S, "state_std": [0.0] * S}})
    with pytest.raises(ValueError, match="state_dim"):
        VLAPolicy.from_state({**state, "norm": NormStats(np.zeros(S + 1), np.ones(S + 1)).to_dict()})
    with pytest.raises(ValueError, match="do not match"):
        VLAPolicy.from_state({**state, "action_dim": A + 1, "norm": NormStats(np.zeros(S), np.ones(S)).to_dict()})
    with pytest.raises(ValueError, match="needs normalization statistics"):
        VLAPolicy(CFG, S, A, None)


def test_trainable_state_dict_round_trip():
    src, dst = make_policy(seed=1), make_policy(seed=2)
    sd = src.trainable_state_dict()
    assert "trunk.embeddings.word_embeddings.weight" not in sd and "log_std" in sd
    assert not any("running_mean" in k for k in sd)  # GroupNorm (the default) has no statistics
    frozen = make_policy(cfg=dataclasses.replace(CFG, vision_norm="frozen_batch"))
    assert any("running_mean" in k for k in frozen.trainable_state_dict())  # frozen BatchNorm statistics shape the
    # output too, so they are published with the weights
    batch = with_prefix(make_batch(src), [0, 1, 2])
    assert not torch.equal(src(batch)[0], dst(batch)[0])
    dst.load_trainable(sd)
    for x, y in zip(src(batch), dst(batch)):
        assert torch.equal(x, y)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    bad = {k: v for k, v in sd.items() if k != "log_std"}
    bad["mean_head.weight"] = torch.zeros(1, 1)
    with pytest.raises(ValueError, match=r"missing \['log_std'\].*shape"):
        dst.load_trainable(bad)
    assert all(torch.equal(v, dst.state_dict()[k]) for k, v in before.items())  # nothing half-written


def test_gradient_reaches_every_trainable_parameter():
    policy = make_policy(seed=4)
    policy.train()
    batch = with_prefix(make_batch(policy, b=4), [0, 1, 2, 3])
    chunk = torch.randn(4, H, A)
    mask = torch.ones(4, H, dtype=torch.bool)
    logp, entropy, value = policy.evaluate(batch, chunk, mask)
    (-logp.mean() + value.pow(2).mean()).backward()
    dead = [n for n, p in policy.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not dead, f"no gradient reaches {dead}"


def test_train_mode_matches_eval_mode(policy):
    fresh = make_policy(seed=6)
    assert not any(m.training for m in fresh.modules() if isinstance(m, torch.nn.BatchNorm2d))
    batch = make_batch(policy)
    policy.eval()
    ev = policy(batch)
    policy.train()
    tr = policy(batch)
    for x, y in zip(ev, tr):  # frozen BatchNorm statistics and no dropout: actor and learner agree
        assert torch.equal(x, y)


def test_construction_is_deterministic_under_manual_seed():
    a, b = make_policy(seed=5).state_dict(), make_policy(seed=5).state_dict()
    assert all(torch.equal(v, b[k]) for k, v in a.items())


@pytest.mark.parametrize("change, message", [
    (lambda b: b.pop("state"), "missing 'state'"),
    (lambda b: b.pop("image/front"), "missing 'image/front'"),
    (lambda b: b.pop("lang"), "policy.embed"),
    (lambda b: b.update({"image/front": b["image/front"].astype(np.float32)}), "must be uint8"),
    (lambda b: b.update({"state": b["state"].astype(np.float64)}), "must be float32"),
    (lambda b: b["state"].__setitem__((1, 2), np.nan), r"contains NaN/inf \(rows \[1\]\)"),
    (lambda b: b.update({"lang": b["lang"][:, :10]}), r"\(3, 384\)"),
    (lambda b: b.update({"image/side": b["image/front"]}), "not built for"),
    (lambda b: b.update({"delay_steps": np.array([1, 0, 0])}), "no 'prefix'"),
    (lambda b: b.update(with_prefix(b, [0, 1, M + 1])), r"must be in \[0, 3\]"),
    (lambda b: b.update({"prefix": np.zeros((3, M, A), np.float32)}), "missing 'delay_steps'"),
])
def test_bad_input_raises_a_clear_value_error(policy, change, message):
    batch = make_batch(policy)
    change(batch)
    with pytest.raises(ValueError, match=message) as info:
        policy(batch)
    assert "\n" not in str(info.value)


def test_config_validation_and_docs():
    docs = field_docs(PolicyConfig)
    assert [f.name for f in dataclasses.fields(PolicyConfig) if f.name not in docs] == []
    with pytest.raises(ConfigError, match="divide policy.trunk_width"):
        PolicyConfig(trunk_width=30, trunk_heads=4)
    with pytest.raises(ConfigError, match="max_delay_steps must be in"):
        PolicyConfig(chunk_len=4, max_delay_steps=5)
    with pytest.raises(ConfigError, match="one of"):
        PolicyConfig(vision="clip")
    assert PolicyConfig(resnet_hidden_sizes=[8, 16], resnet_depths=[1, 1]).resnet_hidden_sizes == (8, 16)


def test_import_policy_config_is_light():
    code = "import acce.policy, acce.policy.config, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_vit_encoder_and_policy_without_delay_input():
    cfg = dataclasses.replace(CFG, vision="vit", vit_width=32, vit_layers=1, vit_heads=2, max_delay_steps=0)
    policy = make_policy(cfg=cfg)
    assert policy.num_tokens == 16 + 4  # image grid, lang, state, two queries; no delay/prefix tokens
    assert policy(make_batch(policy))[0].shape == (3, H, A)
    assert policy(make_batch(policy, size=48))[0].shape == (3, H, A)  # other sizes: interpolated positions
    with pytest.raises(ValueError, match="max_delay_steps=0"):
        policy(with_prefix(make_batch(policy), [0, 0, 0]))


def test_pretrained_vision_dir_loads_locally_and_checkpoint_does_not_need_it(tmp_path):
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(9)
    backbone = ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8, 24], depths=[1, 1], layer_type="basic"))
    backbone.save_pretrained(tmp_path / "enc")
    policy = make_policy(cfg=dataclasses.replace(CFG, vision_pretrained_dir=str(tmp_path / "enc"), freeze_vision=True))
    assert torch.equal(policy.vision.backbone.embedder.embedder.convolution.weight,
                       backbone.embedder.embedder.convolution.weight)
    assert not any(k.startswith("vision.backbone") and "running" not in k and "num_batches" not in k
                   for k in policy.trainable_state_dict())  # frozen encoder weights are not published
    state = policy.policy_state()
    (tmp_path / "enc" / "model.safetensors").unlink()  # the checkpoint alone must be enough
    loaded = VLAPolicy.from_state(state)
    batch = make_batch(policy)
    assert torch.equal(policy(batch)[0], loaded(batch)[0])


def test_hash_encoder_is_deterministic_cached_and_unit_norm():
    enc = HashEncoder()
    e = enc.encode(["push the cube", "reach the goal", "push the cube"])
    assert e.shape == (3, 384) and e.dtype == np.float32 and enc.cache_size == 2
    assert np.array_equal(e[0], e[2]) and not np.allclose(e[0], e[1])
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, rtol=1e-5)
    assert np.array_equal(HashEncoder().encode(["push the cube"])[0], e[0])  # stable across instances/processes
    assert enc.encode([]).shape == (0, 384)
    clone = pickle.loads(pickle.dumps(enc))  # policies travel to remote actors: the encoder must pickle
    assert clone.cache_size == 2 and np.array_equal(clone.encode(["push the cube"])[0], e[0])
    with pytest.raises(ValueError, match="list of instruction strings"):
        enc.encode("push the cube")


@pytest.mark.slow
def test_minilm_encoder_embeds_caches_and_separates_instructions():
    enc = make_language_encoder("minilm")
    texts = ["pick up the red cube", "push the blue block to the goal"]
    e = enc.encode(texts)
    assert e.shape == (2, 384) and e.dtype == np.float32 and np.all(np.isfinite(e))
    assert enc.cache_size == 2
    again = enc.encode([texts[1], texts[0]])
    assert np.array_equal(again, e[::-1]) and enc.cache_size == 2  # served from the cache
    fresh = make_language_encoder("minilm").encode(texts)  # new cache, same frozen model: same numbers
    np.testing.assert_allclose(fresh, e, atol=1e-6)
    assert float(e[0] @ e[1]) < 0.95 and not np.allclose(e[0], e[1])
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, rtol=1e-4)


def test_spatial_softmax_finds_a_hand_placed_peak():
    from acce.policy.vision import SpatialSoftmax
    ss = SpatialSoftmax(in_channels=2, keypoints=2)
    with torch.no_grad():
        ss.heat.weight.copy_(torch.eye(2).view(2, 2, 1, 1))
        ss.heat.bias.zero_()
        ss.log_temperature.fill_(math.log(0.01))  # sharp: the softmax is one-hot at each channel's peak
    fmap = torch.zeros(1, 2, 5, 5)
    fmap[0, 0, 1, 3] = 1.0  # row 1, column 3 of a 5x5 grid over [-1, 1]: x = 0.5, y = -0.5
    fmap[0, 1, 4, 0] = 1.0  # bottom-left corner: x = -1, y = 1
    assert torch.allclose(ss(fmap), torch.tensor([[[0.5, -0.5], [-1.0, 1.0]]]), atol=1e-4)
    ss.log_temperature.data.fill_(math.log(1e6))  # flat: every cell equally likely -> the centre
    assert torch.allclose(ss(fmap), torch.zeros(1, 2, 2), atol=1e-4)


def test_keypoint_tokens_are_added_per_camera_and_trained():
    cfg = dataclasses.replace(CFG, keypoints=5, keypoint_stage=1)
    policy = make_policy(cfg=cfg, cameras=("front", "wrist"))
    assert policy.num_image_tokens == 2 * (16 + 5) and policy.num_tokens == 2 * 21 + 4 + 1 + M
    batch = make_batch(policy, b=4, cameras=("front", "wrist"))
    logp, _, value = policy.evaluate(batch, torch.randn(4, H, A), torch.ones(4, H, dtype=torch.bool))
    (-logp.mean() + value.pow(2).mean()).backward()
    for name in ("vision.keypoints.heat.weight", "vision.keypoints.log_temperature", "keypoint_proj.weight",
                 "keypoint_embed"):
        assert dict(policy.named_parameters())[name].grad.abs().sum() > 0, name
    restored = VLAPolicy.from_state(policy.policy_state())
    assert torch.equal(restored(batch)[0], policy(batch)[0])
    with pytest.raises(ConfigError, match="keypoint_stage"):
        PolicyConfig(keypoints=4, keypoint_stage=3)
    with pytest.raises(ConfigError, match="vision=resnet"):
        PolicyConfig(keypoints=4, vision="vit")
