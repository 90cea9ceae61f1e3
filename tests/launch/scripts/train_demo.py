"""A user's script around Lightning's own demo models, with the one srifty line.

Used by the end-to-end tests of ``srifty-launch``; nothing here knows about the
launcher. The Trainer is a plain one (default logger, progress bar and checkpointing),
so the tests see what a new user would. Data is random (the demos' WikiText2 would
download).

    python train_demo.py --model transformer|cnn|boring [--accumulate K]
        [--precision bf16-mixed] [--max-epochs E] [--explicit-devices N]
        [--explicit-strategy S]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import lightning as L
import torch
from lightning.pytorch.demos import LightningTransformer
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel, Net
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback


class Transformer(LightningTransformer):
    """The demo Transformer on random tokens (its WikiText2 would download)."""

    def prepare_data(self) -> None:
        """Nothing to download."""

    def train_dataloader(self) -> DataLoader:
        tokens = torch.randint(0, 1000, (640, 35), generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(tokens, torch.roll(tokens, -1, 1)), batch_size=8)


class Cnn(L.LightningModule):
    """The demo ``Net`` called through ``self.net``, on random 28x28 images."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.nll_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(640, 1, 28, 28, generator=g)
        return DataLoader(TensorDataset(x, torch.randint(0, 10, (640,), generator=g)), batch_size=8)


class WorkerDataModule(BoringDataModule):
    """Lightning's demo data, read by ``num_workers`` DataLoader worker processes."""

    def __init__(self, num_workers: int) -> None:
        super().__init__()
        self.num_workers = num_workers

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.random_train, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=("transformer", "cnn", "boring"), required=True)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--precision", default="32-true")
    p.add_argument("--max-epochs", type=int, default=None)
    p.add_argument("--explicit-devices", type=int, default=None)
    p.add_argument("--explicit-strategy", default=None)
    p.add_argument("--num-workers", type=int, default=0)
    args = p.parse_args(argv)
    L.seed_everything(0)
    extra: dict[str, Any] = {}
    if args.explicit_devices is not None:
        extra["devices"] = args.explicit_devices  # a script that pins its own devices
    if args.explicit_strategy is not None:
        extra["strategy"] = args.explicit_strategy
    trainer = L.Trainer(
        max_epochs=args.max_epochs,
        accumulate_grad_batches=args.accumulate,
        precision=args.precision,
        callbacks=[SriftyCallback()],
        **extra,
    )
    if args.model == "transformer":
        trainer.fit(Transformer(vocab_size=1000))
    elif args.model == "cnn":
        trainer.fit(Cnn())
    else:
        trainer.fit(BoringModel(), datamodule=WorkerDataModule(args.num_workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
