import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The engine thread and the client share two cores here: with the default thread pool,
    OpenMP workers spin against the event loop and a CPU step gets tens of times slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
