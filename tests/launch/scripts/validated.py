"""A Lightning script with a validation set, checked at every epoch's end, plus the callback.

40 training batches an epoch and 5 validation batches a pass; ``VAL_SLEEP_S=<s>`` makes
every validation batch take at least that long (a pass worth pricing on any machine).

    python validated.py [--max-epochs N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        time.sleep(float(os.environ.get("VAL_SLEEP_S", "0")))
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--max-epochs", type=int, default=100)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(160, 16, generator=g), torch.randn(160, 1, generator=g))
    val = TensorDataset(torch.randn(20, 16, generator=g), torch.randn(20, 1, generator=g))
    trainer = L.Trainer(max_epochs=args.max_epochs, enable_progress_bar=False,
                        enable_model_summary=False, logger=False, enable_checkpointing=False,
                        callbacks=[SriftyCallback()])  # fmt: skip
    trainer.fit(Regressor(), DataLoader(train, batch_size=4, shuffle=True),
                DataLoader(val, batch_size=4))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
