"""ONNX Runtime serving of the frozen part (runtime.inference_backend): the same features as torch at every batch
size, the trunk really skipped, residual swaps kept, frozen swaps handled per backend, and one clear error each
where it cannot apply."""
import time
import warnings

import numpy as np
import pytest
import torch

import acce.policy.onnx_frozen as onnx_frozen
from acce.config import load
from acce.configlib import ConfigError
from acce.policy.onnx_frozen import OnnxFrozen
from acce.policy.vla import VLAPolicy
from acce.serving.inference import InferenceServer
from test_runtime import TINY, tiny_policy  # noqa: E402 (tests/acce is on sys.path)

pytest.importorskip("onnxruntime")

RESIDUAL = ["policy.residual_hidden=16"]
KEYPOINTS = RESIDUAL + ["policy.keypoints=4", "policy.aux_from=keypoints", "policy.aux_input=true", "bc.aux_loss_coef=1.0"]


def make_policy(overrides, seed=0):
    cfg = load(None, TINY + overrides)
    if overrides is not KEYPOINTS:
        return tiny_policy(cfg, seed)
    torch.manual_seed(seed)
    from acce.policy.norm import NormStats
    norm = NormStats.from_states(np.random.default_rng(0).normal(size=(64, 7)).astype(np.float32))
    return VLAPolicy(cfg.policy, 7, 4, norm, aux_dim=4)


def obs(rows, seed=0):
    rng = np.random.default_rng(seed)
    delay = rng.integers(0, 5, rows)
    prefix = rng.normal(size=(rows, 4, 4)).astype(np.float32) * (np.arange(4)[None, :, None] < delay[:, None, None])
    return {"image/front": rng.integers(0, 256, (rows, 32, 32, 3), dtype=np.uint8),
            "state": rng.normal(size=(rows, 7)).astype(np.float32), "instruction": ["reach the red cube"] * rows,
            "task_id": np.zeros(rows, np.int64), "prefix": prefix, "delay_steps": delay}


def count_trunk_calls(policy):
    calls = []
    policy.trunk.register_forward_hook(lambda *_: calls.append(1))
    return calls


UNEVEN = RESIDUAL + ["policy.resnet_hidden_sizes=[8,16]", "policy.resnet_depths=[1,1]", "policy.image_grid=3"]
"""a 4 x 4 feature map pooled to 3 x 3: overlapping bins, which ONNX's pooling ops cannot express (96 x 96 images
with the default encoder: 12 x 12 -> 8 x 8)"""


@pytest.mark.parametrize("overrides", [RESIDUAL, KEYPOINTS, UNEVEN], ids=["plain", "keypoints_aux", "uneven_pooling"])
def test_exported_features_equal_torch_at_every_batch_size(overrides):
    policy = make_policy(overrides).eval()
    frozen = OnnxFrozen.for_policy(policy, policy._inputs(policy.with_lang(obs(3))))
    assert frozen.max_abs_diff <= 1e-5
    for rows in (1, 5, 16):  # other sizes than the export's: the batch axis is dynamic
        x = policy._inputs(policy.with_lang(obs(rows, seed=rows)))
        with torch.inference_mode():
            want = policy.frozen_outputs(x)
        got = frozen(x)
        for key in ("h_action", "h_value", "aux"):
            if want[key] is None:
                assert got[key] is None
            else:
                assert got[key].shape == want[key].shape
                assert torch.allclose(got[key], want[key], atol=1e-5), key
    assert OnnxFrozen.for_policy(policy, policy._inputs(policy.with_lang(obs(7)))) is frozen  # same weights: cached


@pytest.mark.parametrize("overrides", [RESIDUAL, KEYPOINTS, UNEVEN], ids=["plain", "keypoints_aux", "uneven_pooling"])
def test_server_on_onnxruntime_skips_the_trunk_and_matches_torch(overrides):
    torch_server = InferenceServer(make_policy(overrides), deterministic=True, ship_features=True)
    server = InferenceServer(make_policy(overrides), deterministic=True, ship_features=True, backend="onnxruntime")
    server.infer(obs(2))  # the first batch exports
    assert server.backend_in_use == "onnxruntime" and server.stats.onnx_attaches == 1
    calls = count_trunk_calls(server.policy)
    batch = obs(6, seed=1)
    got, want = server.infer(batch), torch_server.infer(batch)
    assert calls == []  # vision + trunk ran in ONNX Runtime
    for key in ("chunk", "mean", "value", "logp_pos", "frozen/h_action"):
        np.testing.assert_allclose(got[key], want[key], atol=1e-5, err_msg=key)
    assert got["frozen_stamp"] == want["frozen_stamp"]  # the learner reuses these features as its own


def test_a_residual_swap_keeps_the_export_and_reaches_the_output():
    torch_server = InferenceServer(make_policy(RESIDUAL), deterministic=True)
    server = InferenceServer(make_policy(RESIDUAL), deterministic=True, backend="auto")
    before = server.infer(obs(4))["mean"]
    state = server.policy.trainable_state_dict()
    moved = {k: v + 0.05 if k.startswith("residual.") else v for k, v in state.items()}
    for s in (server, torch_server):
        s.load_weights(1, {k: v.numpy() for k, v in moved.items()})
    got, want = server.infer(obs(4)), torch_server.infer(obs(4))
    assert server.stats.onnx_attaches == 1 and server.backend_in_use == "onnxruntime"
    assert not np.allclose(got["mean"], before)
    np.testing.assert_allclose(got["mean"], want["mean"], atol=1e-5)


def frozen_swap(server, version):
    state = server.policy.trainable_state_dict()
    server.load_weights(version, {k: (v + 0.1 if k.startswith("trunk.") else v).numpy() for k, v in state.items()})


def swapped_after_export(backend):
    """A server on `backend` that exported at its first batch, and a torch server, both given version 1 with another
    trunk."""
    torch_server = InferenceServer(make_policy(RESIDUAL), deterministic=True)
    server = InferenceServer(make_policy(RESIDUAL), deterministic=True, backend=backend)
    server.infer(obs(2))
    for s in (server, torch_server):
        frozen_swap(s, 1)
    return server, torch_server


def test_auto_falls_back_to_torch_when_a_swap_changes_the_frozen_part():
    server, torch_server = swapped_after_export("auto")
    got, want = server.infer(obs(4)), torch_server.infer(obs(4))
    assert server.backend_in_use == "torch"  # full-network training would export every version
    np.testing.assert_array_equal(got["mean"], want["mean"])
    frozen_swap(server, 2)
    server.infer(obs(2))
    assert server.backend_in_use == "torch" and server.stats.onnx_attaches == 1


def test_onnxruntime_reexports_in_the_background_after_a_frozen_swap():
    server, torch_server = swapped_after_export("onnxruntime")
    want = torch_server.infer(obs(4))["mean"]
    np.testing.assert_allclose(server.infer(obs(4))["mean"], want, atol=1e-5)  # torch meanwhile, or the new export
    deadline = time.monotonic() + 60
    while server.backend_in_use != "onnxruntime" and time.monotonic() < deadline:
        time.sleep(0.05)
        server.infer(obs(1))
    assert server.backend_in_use == "onnxruntime" and server.stats.onnx_attaches == 2
    calls = count_trunk_calls(server.policy)
    np.testing.assert_allclose(server.infer(obs(4))["mean"], want, atol=1e-5)  # the new weights' export
    assert calls == []


def test_learner_passes_never_use_the_backend():
    policy = make_policy(RESIDUAL)
    InferenceServer(policy, backend="onnxruntime").infer(obs(2))
    assert policy.frozen_backend is not None
    calls = count_trunk_calls(policy)
    with torch.enable_grad():
        policy.features(policy.with_lang(obs(2)))["h_action"].sum().backward()  # gradients need torch's graph
    assert calls == [1]


def test_bad_backends_fail_with_one_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="must be one of"):
        InferenceServer(make_policy(RESIDUAL), backend="tensorrt")
    with pytest.raises(ConfigError, match="runtime.inference_backend must be one of"):
        load(None, TINY + ["runtime.inference_backend=tensorrt"])
    monkeypatch.setattr(onnx_frozen, "ort_available", lambda: False)
    with pytest.raises(ValueError, match="onnxruntime or onnx is not installed"):
        InferenceServer(make_policy(RESIDUAL), backend="onnxruntime")
    server = InferenceServer(make_policy(RESIDUAL), backend="auto")  # auto: torch, no error
    server.infer(obs(2))
    assert server.backend_in_use == "torch"


def test_auto_serves_with_torch_when_the_export_fails(monkeypatch):
    def broken(*_, **__):
        raise RuntimeError("exporter exploded")
    monkeypatch.setattr(OnnxFrozen, "for_policy", broken)
    torch_server = InferenceServer(make_policy(RESIDUAL), deterministic=True)
    server = InferenceServer(make_policy(RESIDUAL), deterministic=True, backend="auto")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = server.infer(obs(3))
    assert any("exporter exploded" in str(w.message) for w in caught)
    np.testing.assert_array_equal(got["mean"], torch_server.infer(obs(3))["mean"])
    with pytest.raises(RuntimeError, match="exporter exploded"):  # asked for by name: no silent fallback
        InferenceServer(make_policy(RESIDUAL), backend="onnxruntime").infer(obs(3))


@pytest.mark.parametrize("size_in,size_out", [(12, 8), (4, 3), (8, 8), (5, 2), (2, 3)])
def test_pool_matrix_averages_as_torch_adaptive_pooling(size_in, size_out):
    from acce.policy.vision import pool_matrix
    m = pool_matrix(size_in, size_out)
    if (size_in, size_out) == (4, 3):  # torch's bins for 4 -> 3: [0, 2), [1, 3), [2, 4)
        assert torch.equal(m, torch.tensor([[.5, .5, 0, 0], [0, .5, .5, 0], [0, 0, .5, .5]]))
    x = torch.randn(2, 3, size_in, size_in + 1)
    want = torch.nn.functional.adaptive_avg_pool2d(x, size_out)
    assert torch.allclose(pool_matrix(size_in, size_out) @ x @ pool_matrix(size_in + 1, size_out).T, want, atol=1e-6)
