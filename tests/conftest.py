
import pytest
import torch

# Keep the suite predictable on small CI machines.
torch.set_num_threads(1)  # tiny models: 1 thread avoids OpenMP oversubscription


@pytest.fixture
def tiny_policy():
    from digenrl.models.tiny_dit import TinyDiTConfig, TinyDiTPolicy

    torch.manual_seed(0)
    return TinyDiTPolicy(TinyDiTConfig(dim=32, depth=1, heads=2))
