import os

import pytest

# Before any test imports mujoco or a hub-aware library: render offscreen, never touch a model hub.
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="module")
def ray_cluster():
    """A 2-CPU embedded Ray cluster per test module (the e2e tests share it across their tests)."""
    import ray
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()
