"""The GPU path (runtime.device, runtime.amp, docs/design.md §13): on CPU, placement changes no number and the
config fails loudly; a pretrained ResNet keeps its BatchNorm; the SigLIP-style tower round-trips. Tests marked `gpu`
run a learner update, an inference batch and a short `acce train` on CUDA (skipped without one; CI deselects them)."""
import dataclasses
import json

import numpy as np
import pytest
import torch
from torch import nn

from acce.config import load
from acce.configlib import ConfigError
from acce.device import driver_device, place, resolve_device, role_device
from acce.policy import PolicyConfig, VLAPolicy
from acce.policy.vision import VisionEncoder
from acce.runtime.learner import make_learner
from acce.serving.inference import InferenceServer
from test_learner import segment  # noqa: E402  (tests/acce is on sys.path under pytest's rootdir import mode)
from test_learner import make_learner as tiny_learner
from test_offpolicy import TD3
from test_policy import make_batch, make_policy, with_prefix

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# --- config and resolution ------------------------------------------------------------------------------------------
def test_runtime_device_values_are_checked_by_the_schema():
    assert load(None, []).runtime.device == "auto"
    with pytest.raises(ConfigError, match=r"runtime.device must be one of \['auto', 'cpu', 'cuda'\]"):
        load(None, ["runtime.device=gpu"])
    with pytest.raises(ConfigError, match="learner_gpus"):
        load(None, ["runtime.learner_gpus=-1"])


def test_cuda_without_a_cuda_device_fails_at_start_up_in_one_line(monkeypatch, tmp_path):
    no_cuda(monkeypatch)
    assert resolve_device("auto").type == "cpu" and resolve_device("cpu").type == "cpu"
    with pytest.raises(ConfigError, match="runtime.device=cuda but this process sees no CUDA device.*auto") as err:
        resolve_device("cuda")
    assert "\n" not in str(err.value)
    from acce.train import Trainer
    cfg = load("configs/debug.yaml", [f"run.out_dir={tmp_path}", "runtime.device=cuda"])
    with pytest.raises(ConfigError, match="runtime.device=cuda"):
        Trainer(cfg, progress=False)
    assert not (tmp_path / "debug").exists()  # nothing written before the check


def test_a_driver_joining_a_cluster_leaves_the_cuda_check_to_the_gpu_roles(monkeypatch):
    no_cuda(monkeypatch)
    rt = load(None, ["runtime.device=cuda", "runtime.address=auto"]).runtime
    assert driver_device(rt).type == "cpu" and role_device(rt) == "cuda"
    rt = load(None, ["runtime.device=auto", "runtime.address=auto"]).runtime
    assert role_device(rt) == "cpu"  # auto is decided once, by the driver
    with pytest.raises(ConfigError):
        driver_device(load(None, ["runtime.device=cuda"]).runtime)  # embedded cluster: this machine's GPUs


# --- CPU placement is the identity ---------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", [[], TD3], ids=["ppo", "td3"])
def test_cpu_placement_changes_no_number_of_an_update(algorithm):
    """place(policy, 'cpu', amp=True) is today's path bit for bit: amp is ignored on CPU, tensors stay put."""
    results = []
    for placed in (False, True):
        _, base = tiny_learner(["learner.max_staleness=-1", *algorithm])
        policy = place(base.policy, "cpu", amp=True) if placed else base.policy
        assert not policy.amp
        learner = make_learner(policy, base.cfg, seed=0)
        torch.manual_seed(1)
        metrics = [learner.update([segment([1.0, 0.0, 1.0, 0.5]), segment([0.0, 1.0, 0.0, 0.0])]) for _ in range(2)]
        results.append((metrics, {k: v.clone() for k, v in learner.policy.state_dict().items()}))
    (m0, s0), (m1, s1) = results
    drop = ("learner/update_s", "queue/wait_s_mean")
    assert [{k: v for k, v in m.items() if k not in drop} for m in m0] == \
        [{k: v for k, v in m.items() if k not in drop} for m in m1]
    assert all(torch.equal(s0[k], s1[k]) for k in s0)


def test_cpu_placement_changes_no_number_of_an_inference_batch():
    outs = []
    for placed in (False, True):
        policy = make_policy()
        server = InferenceServer(place(policy, "cpu", amp=True) if placed else policy, seed=3)
        outs.append(server.infer({**with_prefix(make_batch(policy), [0, 1, 2]), "instruction": ["a", "b", "c"]}))
    for k in ("chunk", "mean", "value", "logp_pos"):
        assert isinstance(outs[1][k], np.ndarray) and np.array_equal(outs[0][k], outs[1][k]), k


# --- pretrained encoders keep their normalization ------------------------------------------------------------------
def saved_resnet(path):
    """A tiny ResNetModel with trained-looking BatchNorm statistics, saved the save_pretrained way."""
    from transformers import ResNetConfig, ResNetModel
    torch.manual_seed(0)
    model = ResNetModel(ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                     layer_type="basic", downsample_in_first_stage=False))
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    model.save_pretrained(path)
    return model


def test_a_pretrained_resnet_keeps_its_batchnorm(tmp_path):
    saved = saved_resnet(tmp_path)
    cfg = PolicyConfig(language="hash", vision_pretrained_dir=str(tmp_path))
    assert cfg.vision_norm == "auto" and cfg.resnet_norm == "frozen_batch"
    enc = VisionEncoder(cfg)
    bns = [m for m in enc.backbone.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and not any(isinstance(m, nn.GroupNorm) for m in enc.backbone.modules())
    assert all(not m.training for m in bns)  # frozen statistics, even in train mode
    want = saved.state_dict()
    for k, v in enc.backbone.state_dict().items():
        assert torch.equal(v, want[k]), k
    scratch = VisionEncoder(PolicyConfig(language="hash"))  # from scratch, 'auto' is GroupNorm as before
    assert not any(isinstance(m, nn.BatchNorm2d) for m in scratch.modules())


def test_groupnorm_over_a_pretrained_resnet_is_refused_and_old_states_still_load(tmp_path):
    saved_resnet(tmp_path)
    with pytest.raises(ConfigError, match="vision_norm=group would replace the pretrained ResNet's BatchNorms"):
        PolicyConfig(language="hash", vision_pretrained_dir=str(tmp_path), vision_norm="group")
    # a policy saved before the rule (group over a pretrained dir) is rebuilt as it ran: GroupNorm, weights as saved
    state = make_policy().policy_state()
    state["config"] = {**state["config"], "vision_pretrained_dir": str(tmp_path), "vision_norm": "group"}
    assert any(isinstance(m, nn.GroupNorm) for m in VLAPolicy.from_state(state).vision.modules())


def test_siglip_tower_builds_from_its_config_and_round_trips():
    cfg = dataclasses.replace(PolicyConfig(language="hash", chunk_len=4, max_delay_steps=3, trunk_width=32,
                                           trunk_layers=1, trunk_heads=2), vision="siglip", vit_width=32, vit_heads=2)
    policy = make_policy(cfg=cfg).eval()
    batch = with_prefix(make_batch(policy, size=32), [0, 1, 2])
    mean, _, value = policy(batch)
    assert mean.shape == (3, 4, 3) and value.shape == (3,)
    rebuilt = VLAPolicy.from_state(policy.policy_state()).eval()
    assert torch.equal(rebuilt(batch)[0], mean)


# --- on a GPU -------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("algorithm", [[], TD3], ids=["ppo", "td3"])
def test_learner_update_on_cuda(algorithm):
    _, base = tiny_learner(["learner.max_staleness=-1", *algorithm])
    learner = make_learner(place(base.policy, "cuda", amp=True), base.cfg, seed=0)
    assert learner.policy.amp
    for _ in range(2):
        metrics = learner.update([segment([1.0, 0.0, 1.0, 0.5]), segment([0.0, 1.0, 0.0, 0.0])])
    assert all(p.is_cuda for p in learner.policy.parameters())
    assert all(np.isfinite(v) for v in metrics.values()), metrics
    assert all(torch.isfinite(p).all() for p in learner.policy.parameters())
    assert all(isinstance(v, np.ndarray) for v in learner.trainable_state().values())  # published as CPU numpy


@pytest.mark.gpu
@cuda
def test_inference_batch_on_cuda_returns_cpu_numpy_close_to_float32():
    policy = make_policy()
    batch = {**with_prefix(make_batch(policy), [0, 1, 2]), "instruction": ["a", "b", "c"]}
    ref = InferenceServer(make_policy(), deterministic=True).infer(batch)
    server = InferenceServer(place(policy, "cuda", amp=True), seed=3, deterministic=True)
    out = server.infer(batch)
    assert all(p.is_cuda for p in server.policy.parameters())
    for k in ("chunk", "mean", "value", "logp_pos"):
        assert isinstance(out[k], np.ndarray) and out[k].dtype == np.float32 and np.isfinite(out[k]).all(), k
    np.testing.assert_allclose(out["mean"], ref["mean"], atol=0.05)  # bf16 trunk, float32 heads
    sampled = InferenceServer(policy, seed=3).infer(batch)  # a generator on the policy's device
    assert np.isfinite(sampled["chunk"]).all() and np.isfinite(sampled["logp_pos"]).all()


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kind", ["local", "ray"])
def test_short_train_on_cuda(kind, tmp_path, monkeypatch):
    from acce.train import Trainer, train
    seen = {}
    make_runtime = Trainer.make_runtime

    def spy(self, learner):
        seen["learner"] = learner
        return make_runtime(self, learner)
    monkeypatch.setattr(Trainer, "make_runtime", spy)
    cfg = load("configs/debug.yaml", [f"run.out_dir={tmp_path}", "runtime.device=cuda", f"runtime.kind={kind}"])
    summary = train(cfg, progress=False)
    assert summary["learner_version"] >= cfg.train.max_versions
    assert all(p.is_cuda for p in seen["learner"].policy.parameters())  # the driver's learner (and BC) on CUDA
    data = torch.load(tmp_path / "debug" / "checkpoints" / "latest.pt", map_location="cpu", weights_only=False)
    weights = data["learner"]["policy"]["state_dict"]
    assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())
    assert json.loads((tmp_path / "debug" / "summary.json").read_text())["learner_version"] > 0
