"""A user's script as Lightning users write it, with the one srifty line.

The Trainer may fix its own shape (``--devices 2 --strategy ddp`` become
``Trainer(strategy="ddp", devices=2)``), which srifty-launch must keep. For the tests
only, ``TRACE_BATCHES=<file>`` makes every rank append ``rank world batch`` for each
training batch it runs (the job's own record of what ran).

    python user_ddp.py [--devices N] [--strategy S] [--batch-size B] [--max-steps N] [--conv]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback


class Regressor(L.LightningModule):
    def __init__(self, conv: bool = False) -> None:
        super().__init__()
        if conv:  # compute-bound: many FLOPs, few parameters to all-reduce
            self.net = nn.Sequential(
                nn.Unflatten(1, (2, 4, 4)), nn.Upsample(scale_factor=6),
                nn.Conv2d(2, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
                nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1),
            )  # fmt: skip
        else:
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        trace = os.environ.get("TRACE_BATCHES")
        if trace:
            with open(trace, "a") as fh:
                fh.write(f"{self.global_rank} {self.trainer.world_size} {len(x)}\n")
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=None)
    p.add_argument("--strategy", default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--conv", action="store_true", help="a compute-bound convolutional model")
    args = p.parse_args()
    L.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=args.batch_size,
                      shuffle=True)  # fmt: skip
    fixed: dict[str, Any] = {}
    if args.devices is not None:
        fixed["devices"] = args.devices
    if args.strategy is not None:
        fixed["strategy"] = args.strategy
    trainer = L.Trainer(
        max_steps=args.max_steps,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[SriftyCallback()],
        **fixed,
    )
    trainer.fit(Regressor(conv=args.conv), data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
