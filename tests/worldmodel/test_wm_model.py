import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from wm_helpers import tiny_cfg, tiny_model

from acce.configlib import ConfigError, field_docs
from worldmodel.config import WMConfig
from worldmodel.model import WorldModel

B = 5


def _obs(seed: int = 0, n: int = B) -> dict:
    rng = np.random.default_rng(seed)
    return {"image/front": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
            "state": rng.normal(size=(n, 7)).astype(np.float32),
            "instruction": [f"touch the {c} cube" for c in rng.choice(["red", "green", "blue"], n)]}


def _all_heads(model: WorldModel) -> dict:
    with torch.no_grad():
        z = model.encode(_obs())
        a = torch.as_tensor(np.random.default_rng(1).uniform(-1, 1, (B, 4)), dtype=torch.float32)
        p = model.next(z, a)
        return {"z": z, "next": p.z, "heads": p.heads, "disagreement": p.disagreement, "reward": model.reward(z, a),
                "terminated": model.terminated(p.z), "success": model.success(p.z), "decode": model.decode(z)}


def test_every_head_has_the_documented_shape():
    out = _all_heads(tiny_model())
    L, G, K = 32, 8, 3
    assert out["z"].shape == (B, L + G) and out["next"].shape == (B, L + G) and out["heads"].shape == (K, B, L + G)
    for key in ("disagreement", "reward", "terminated", "success"):
        assert out[key].shape == (B,), key
    dec = out["decode"]
    assert set(dec) == {"image/front", "state"}
    assert dec["image/front"].dtype == np.uint8 and dec["image/front"].shape == (B, 32, 32, 3)
    assert dec["state"].dtype == np.float32 and dec["state"].shape == (B, 7)
    # latents are layer-normalized (fixed scale) and the heads start independent, so they disagree a little
    assert out["z"][:, :L].std(-1).mean().item() == pytest.approx(1.0, abs=0.05)
    assert (out["disagreement"] > 0).all()
    assert torch.allclose(out["next"], out["heads"].mean(0))


def test_the_instruction_conditions_reward_and_success_not_physics():
    model = tiny_model()
    with torch.no_grad():
        model.instruction_embedding.weight.normal_()  # as if trained (it starts at zero: unseen words are neutral)
        red, blue = _obs(), _obs()
        red["instruction"], blue["instruction"] = ["touch the red cube"] * B, ["touch the blue cube"] * B
        zr, zb = model.encode(red), model.encode(blue)
        a = torch.zeros(B, 4)
        assert torch.equal(zr[:, :32], zb[:, :32]) and not torch.equal(zr[:, 32:], zb[:, 32:])
        assert torch.equal(model.next(zr, a).z[:, :32], model.next(zb, a).z[:, :32])
        assert torch.equal(model.next(zr, a).z[:, 32:], zr[:, 32:])  # carried unchanged
        np.testing.assert_array_equal(model.decode(zr)["image/front"], model.decode(zb)["image/front"])
        assert not torch.equal(model.reward(zr, a), model.reward(zb, a))
        assert not torch.equal(model.success(zr), model.success(zb))
    with pytest.raises(KeyError, match="instruction"):
        model.encode({k: v for k, v in red.items() if k != "instruction"})


def test_decoding_composites_onto_the_start_frame():
    model, obs = tiny_model(), _obs()
    with torch.no_grad():
        z = model.encode(obs)
        free = model.decode(z)["image/front"]
        model.image_decoder.out.bias[3:] = -100.0  # alpha = 0: every pixel comes from the context
        np.testing.assert_array_equal(model.decode(z, obs)["image/front"], obs["image/front"])
        model.image_decoder.out.bias[3:] = 100.0  # alpha = 1: the context is ignored
        np.testing.assert_array_equal(model.decode(z, obs)["image/front"], free)


def test_heads_are_deterministic_under_manual_seed():
    a, b, c = _all_heads(tiny_model(seed=0)), _all_heads(tiny_model(seed=0)), _all_heads(tiny_model(seed=1))
    for key in ("z", "heads", "reward", "terminated", "success"):
        assert torch.equal(a[key], b[key]), key
        assert not torch.equal(a[key], c[key]), key
    for key in a["decode"]:
        np.testing.assert_array_equal(a["decode"][key], b["decode"][key])


def test_missing_normalization_is_an_error(tmp_path):
    torch.manual_seed(0)
    model = WorldModel(tiny_cfg(), state_dim=7, action_dim=4, control_hz=10.0)
    with pytest.raises(RuntimeError, match="normalization"):
        model.encode(_obs())
    with pytest.raises(RuntimeError, match="normalization"):
        model.save(tmp_path / "wm.pt")


def test_wrong_image_size_names_the_setting():
    with pytest.raises(ValueError, match="wm.image_size"):
        tiny_model().encode({"image/front": np.zeros((1, 64, 64, 3), np.uint8), "state": np.zeros((1, 7)),
                             "instruction": ["x"]})


def test_checkpoint_round_trip_is_self_describing(tmp_path):
    model = tiny_model(seed=3)
    model.version, model.data_info = 42, {"path": "somewhere", "val_episode_ids": ["a"]}
    model.save(tmp_path / "worldmodel.pt")
    loaded = WorldModel.load(tmp_path)  # a directory means <dir>/worldmodel.pt (what wm-pretrain writes)
    assert loaded.version == 42 and loaded.data_info == model.data_info
    assert loaded.cfg == model.cfg and loaded.cameras == model.cameras and loaded.control_hz == model.control_hz
    assert loaded.normalization() == model.normalization()
    a, b = _all_heads(model), _all_heads(loaded)
    for key in ("z", "heads", "reward", "terminated", "success"):
        assert torch.equal(a[key], b[key]), key
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


def test_checkpoint_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="wm-pretrain"):
        WorldModel.load(tmp_path / "none.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable"):
        WorldModel.load(tmp_path / "junk.pt")
    torch.save({"hello": 1}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not an acce world-model"):
        WorldModel.load(tmp_path / "foreign.pt")
    model = tiny_model()
    model.save(tmp_path / "wm.pt")
    payload = torch.load(tmp_path / "wm.pt", weights_only=True)
    del payload["normalization"]
    torch.save(payload, tmp_path / "nostats.pt")
    with pytest.raises(ValueError, match="normalization"):
        WorldModel.load(tmp_path / "nostats.pt")


@pytest.mark.parametrize("override, message", [
    ({"ensemble_size": 2}, "at least 3"), ({"image_size": 48}, "power of two"),
    ({"action_level": "chunk"}, "control_step"), ({"max_disagreement": 0.0}, "> 0"),
])
def test_config_rejects_contradictions(override, message):
    with pytest.raises(ConfigError, match=message):
        tiny_cfg(**override)


def test_every_wm_config_field_has_a_docstring():
    import dataclasses
    docs = field_docs(WMConfig)
    assert [f.name for f in dataclasses.fields(WMConfig) if f.name not in docs] == []


def test_import_worldmodel_is_light():
    code = ("import worldmodel, worldmodel.config, worldmodel.cli, sys; "
            "print([m for m in ('torch', 'ray', 'mujoco', 'lerobot') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_wm_metric_keys_are_documented():
    """Every literal wm/ key in worldmodel/ is in docs/metrics.md, and wm/ is a metric group."""
    import re
    from pathlib import Path

    from acce.metrics import PREFIXES
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "metrics.md").read_text()
    assert "wm/" in PREFIXES and "## wm/" in text
    keys = {k for p in (root / "worldmodel").glob("*.py") for k in re.findall(r'"(wm/[a-z_/]+)', p.read_text())}
    assert {"wm/loss/", "wm/val/", "wm/version"} <= keys
    # wm/loss/<part> and wm/val/<part> are documented once, with the list of parts
    normalized = {re.sub(r"^(wm/(?:loss|val)/)[a-z_]*$", r"\1<part>", k) for k in keys}
    assert all(f"`{part}`" in text for part in ("total", "image_pred", "latent", "reward", "done"))
    missing = [k for k in sorted(normalized) if k not in text]
    assert not missing, f"undocumented world-model metric keys: {missing}"


def test_read_only_observations_and_episodes_are_scored_without_a_warning():
    # torch warns once per process about wrapping a read-only array (zarr chunks, shared-memory episodes), so the
    # check runs in a fresh interpreter with warnings as errors
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys, numpy as np, torch; sys.path.insert(0, {here!r}); from wm_helpers import tiny_model\n"
            "m = tiny_model(); rng = np.random.default_rng(0)\n"
            "obs = {'image/front': rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8), 'state': np.ones((3, 7), np.float32),"
            " 'instruction': ['x'] * 3}\n"
            "ref = m.encode(obs)\n"
            "[v.setflags(write=False) for k, v in obs.items() if k != 'instruction']\n"
            "with torch.no_grad(): assert torch.equal(m.encode(obs), ref.detach())\n"
            "from wm_helpers import fake_episode; from worldmodel.data import from_episode\n"
            "from worldmodel.calibration import one_step_logits\n"
            "ep = from_episode(fake_episode(6, 0), m.cameras)\n"
            "[a.setflags(write=False) for a in (ep.images, ep.state, ep.action)]\n"
            "assert one_step_logits(m, ep).shape == (6, 2)\n")
    subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code], check=True)
