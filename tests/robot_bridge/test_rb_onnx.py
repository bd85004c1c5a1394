"""`acce serve` on ONNX Runtime (its default `--inference-backend auto`): the served actions are torch's, and a hot
reload that changes the frozen weights is exported again while torch serves, never a stall or a stale graph."""
import time

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

EXPORTABLE = ["policy.image_grid=1"]
"""the bridge's tiny policy pools a 1 x 1 map to 2 x 2, which ONNX cannot; with grid 1 nothing is pooled"""


def test_served_actions_equal_torch_and_a_reload_is_exported_again(tmp_path, make_obs, write_ckpt):
    from robot_bridge.host import PolicyHost

    path = write_ckpt(tmp_path / "latest.pt", version=3, overrides=EXPORTABLE)
    onnx, plain = PolicyHost(path), PolicyHost(path, inference_backend="torch")
    try:
        obs = make_obs(onnx.metadata())
        first = onnx.infer(obs)
        assert onnx.inference.backend_in_use == "onnxruntime" and plain.inference.backend_in_use == "torch"
        np.testing.assert_allclose(first["actions"], plain.infer(obs)["actions"], atol=1e-5)
        write_ckpt(path, version=7, seed=1, overrides=EXPORTABLE)  # another mean head: a frozen weight changed
        assert "7" in onnx.reload_if_newer() and "7" in plain.reload_if_newer()
        want = plain.infer(obs)["actions"]
        deadline = time.monotonic() + 60
        while True:
            got = onnx.infer(obs)  # torch until the background export of version 7 is attached
            np.testing.assert_allclose(got["actions"], want, atol=1e-5)
            if onnx.inference.backend_in_use == "onnxruntime":
                break
            assert time.monotonic() < deadline, "the reloaded weights were never exported"
            time.sleep(0.05)
        assert got["policy_version"] == 7 and onnx.inference.stats.onnx_attaches == 2
        assert not np.allclose(want, first["actions"])
    finally:
        onnx.close()
        plain.close()


def test_serve_config_refuses_an_unknown_backend():
    from robot_bridge.server import ServeConfig
    with pytest.raises(ValueError, match="inference_backend must be one of"):
        ServeConfig(inference_backend="tensorrt")
