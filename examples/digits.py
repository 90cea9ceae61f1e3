"""A small, deterministic Lightning model on scikit-learn's digits (no download).

Importable so tests and benchmarks train the exact model the example script trains.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

from lightning_srifty import ResumableLoader


class DigitsModule(pl.LightningModule):
    """MLP classifier for 8x8 digit images; ``hidden`` scales the step time."""

    def __init__(self, hidden: int = 256, depth: int = 2, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        layers: list[nn.Module] = [nn.Linear(64, hidden), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(hidden, 10)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        return self.loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)


class DigitsDataModule(pl.LightningDataModule):
    """The 1797 digits, scaled to [0, 1], in a seeded order that resumes mid-epoch."""

    def __init__(self, batch_size: int = 64, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.seed = seed
        self.dataset: TensorDataset | None = None

    def setup(self, stage: str) -> None:
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
        self.dataset = TensorDataset(x, y)

    def train_dataloader(self) -> ResumableLoader:
        # A resumable loader, so a resumed run continues at the exact batch; a plain
        # DataLoader works too, but Lightning then restarts the epoch after a resume.
        assert self.dataset is not None
        return ResumableLoader(
            self.dataset, batch_size=self.batch_size, shuffle=True, seed=self.seed
        )
