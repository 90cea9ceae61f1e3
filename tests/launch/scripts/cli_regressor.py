"""A LightningCLI script, with the one srifty line (the callback in trainer_defaults).

python cli_regressor.py fit [--trainer.max_steps N] [--data.batch_size B]
"""

from __future__ import annotations

import os
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback


class Regressor(L.LightningModule):
    def __init__(self, hidden: int = 64, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        trace = os.environ.get("TRACE_BATCHES")
        if trace:
            with open(trace, "a") as fh:
                fh.write(f"{self.global_rank} {self.trainer.world_size} {len(x)}\n")
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])


class RandomData(L.LightningDataModule):
    def __init__(self, batch_size: int = 32, samples: int = 4096) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.samples = samples

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.samples, 32, generator=g)
        return DataLoader(
            TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.batch_size, shuffle=True
        )


if __name__ == "__main__":
    LightningCLI(Regressor, RandomData, trainer_defaults={"callbacks": [SriftyCallback()]})
