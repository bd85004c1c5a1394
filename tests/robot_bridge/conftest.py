"""Shared fixtures: a tiny checkpoint written the way `acce train` writes one (without training: the bridge only
needs a loadable, normalized policy), one served host for the session, and loopback servers around it."""
from __future__ import annotations

import numpy as np
import pytest

TINY = ["policy.language=hash", "policy.resnet_hidden_sizes=[8,16,32]", "policy.image_grid=2",
        "policy.trunk_width=32", "policy.trunk_layers=1", "policy.trunk_heads=2", "policy.chunk_len=8",
        "policy.max_delay_steps=4", "env.image_size=32", "env.tasks=[reach]", "rollout.execution_horizon=4"]
"""the debug preset's policy: fast enough for real-time loops in tests"""


def write_checkpoint(path, version: int = 3, seed: int = 0, norm_seed: int = 0, overrides: list[str] | None = None):
    """A checkpoint in acce's format (config + learner.policy with normalization stats + version). `seed` changes
    the weights only, `norm_seed` the normalization statistics."""
    import torch

    from acce.checkpoint import save_checkpoint
    from acce.config import load
    from acce.configlib import to_dict
    from acce.train import build_policy

    cfg = load(None, TINY + list(overrides or []))
    states = np.random.default_rng(norm_seed).normal(0.0, 0.05, size=(64, 7)).astype(np.float32)
    with torch.random.fork_rng(devices=[]):
        policy = build_policy(cfg, states)
        if seed:
            torch.manual_seed(seed)
            with torch.no_grad():
                policy.mean_head.bias.normal_(0.0, 0.5)  # visibly different actions from the seed-0 weights
    return save_checkpoint(path, {"config": to_dict(cfg), "learner": {"policy": policy.policy_state(),
                                                                       "version": version}})


@pytest.fixture(scope="session")
def write_ckpt():
    """write_ckpt(path, version=3, seed=0) -> path of a fresh checkpoint file"""
    return write_checkpoint


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "latest.pt")


@pytest.fixture(scope="session")
def host(checkpoint):
    from robot_bridge.host import PolicyHost
    h = PolicyHost(checkpoint)
    yield h
    h.close()


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(torch_threads_module: int) -> None:
    """Serve on one torch thread, as `acce serve` does (PolicyHost: 30-100x faster on 2 busy cores); the setting
    is process-wide, so every module gives the other test folders their thread count back (torch_threads_module)."""


@pytest.fixture()
def server(host):
    from robot_bridge.server import PolicyServer, ServeConfig
    srv = PolicyServer(host, ServeConfig(port=0, reload_interval_s=0)).start()
    yield srv
    srv.stop()


def _observation(meta, seed: int = 0, instruction: str = "touch the red cube") -> dict:
    rng = np.random.default_rng(seed)
    size = int(meta["image_size"])
    obs = {f"image/{c}": rng.integers(0, 256, (size, size, 3), np.uint8) for c in meta["cameras"]}
    obs["state"] = rng.normal(0, 0.05, int(meta["state_dim"])).astype(np.float32)
    obs["instruction"] = instruction
    return obs


@pytest.fixture(scope="session")
def make_obs():
    """make_obs(meta, seed=0, instruction=...) -> a valid unbatched request for a server's metadata"""
    return _observation
