import pytest


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models train ~8x faster on one thread than on two when the 2-core machine is shared (measured:
    58 vs 7 steps/s); restore the setting for the rest of the suite."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
