"""Small IGAMT models and EHR batches shared by the IGAMT tests."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_dprobust.methods.igamt import IGAMT

F, T = 6, 5
SMALL = dict(
    num_features=F, static_continuous=1, static_groups=(2,), max_steps=T, d_model=16, heads=2, d_ff=32,
    noise_size=8, critic_hidden=16, synthetic_batch_size=4,
)  # fmt: skip


def ehr_batch(b: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tensors of the data contract: step 0 static (1 continuous slot + one-hot of 2), steps 1..T temporal."""
    generator = torch.Generator().manual_seed(seed)
    m = (torch.rand(b, T + 1, F, generator=generator) < 0.7).float()
    x = torch.rand(b, T + 1, F, generator=generator)
    m[:, 0] = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    x[:, 0, 1:] = 0.0
    x[:, 0, 1 + torch.randint(2, (b,), generator=generator)] = 1.0
    return x * m, m


def small(init_seed: int = 0, **kwargs) -> IGAMT:
    torch.manual_seed(init_seed)
    return IGAMT(**(SMALL | kwargs))


def ready(module: IGAMT, rate: float = 0.25, n: int = 16) -> IGAMT:
    """Set up as fit would (rate, dataset size, randomness root), outside a Trainer; q * n = 4 = the test batch."""
    module.loaders.sample_rate, module.loaders.num_examples = rate, n
    if module.dp_enabled:
        module.randomness.start(SimpleNamespace(world_size=1))
    module.configure_optimizers()
    return module


class EHRData(L.LightningDataModule):
    """Random EHR tensors in a shuffled loader (the DP modules replace it by a Poisson one)."""

    def __init__(self, n: int = 16, batch_size: int = 4) -> None:
        super().__init__()
        self.train_set, self.batch_size = TensorDataset(*ehr_batch(n, seed=1)), batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)
