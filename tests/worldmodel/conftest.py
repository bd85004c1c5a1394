import pytest


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread(torch_threads_module: int) -> None:
    """Tiny models train ~8x faster on one thread than on two when the 2-core machine is shared (measured:
    58 vs 7 steps/s); tests/conftest.py restores the setting for the rest of the suite."""
