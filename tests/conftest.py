import os
from typing import Iterator

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


def _hold_torch_threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """Set torch's thread count (the indirect parameter, else 1) and give the old one back: the setting is
    process-wide, so a test that changes it must not leave it changed for the rest of the suite."""
    import torch
    n = getattr(request, "param", 1)
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    yield n
    torch.set_num_threads(before)


@pytest.fixture
def torch_threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """One test on n torch threads (1 unless `@pytest.mark.parametrize("torch_threads", [n], indirect=True)`)."""
    yield from _hold_torch_threads(request)


@pytest.fixture(scope="module")
def torch_threads_module(request: pytest.FixtureRequest) -> Iterator[int]:
    """torch_threads held for a whole module, for a folder's autouse fixture (module-scoped fixtures then build
    their models under it too)."""
    yield from _hold_torch_threads(request)
