"""An unmodified Lightning script with a plain shuffled DataLoader, plus the callback.

Dropout draws from the global generator every step, so the loss curve depends on the
data order and on the random state alike. For the tests only, ``LOSS_LOG=<file>`` makes
rank zero append ``step loss`` (the loss with every digit) after each batch, and
``STEP_SLEEP_S=<s>`` makes every batch take at least that long (a run long enough for a
revocation on any machine; the losses do not change).

``--stream`` serves the same samples from an ``IterableDataset`` instead (a stream in a
fixed order, as a file or a shard is read; no sampler, no length). ``--paired`` trains
on a dict of two shuffled loaders, the second one a quarter as long (Lightning cycles it
several times an epoch, drawing a new order each pass).

    python plain_loader.py [--max-steps N] [--num-workers W] [--stream | --paired]
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
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from lightning_srifty import SriftyCallback


class Stream(IterableDataset):
    """The samples in the same fixed order every time the stream is read."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __iter__(self) -> Any:
        return iter(zip(self.x, self.y, strict=True))


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.3),
                                 nn.Linear(64, 4))  # fmt: skip

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        pairs = list(batch.values()) if isinstance(batch, dict) else [batch]
        return sum(nn.functional.cross_entropy(self.net(x), y) for x, y in pairs)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        time.sleep(float(os.environ.get("STEP_SLEEP_S", "0")))
        log = os.environ.get("LOSS_LOG")
        if log and self.global_rank == 0:
            with open(log, "a") as fh:
                fh.write(f"{self.global_step} {float(outputs['loss']).hex()}\n")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--paired", action="store_true")
    args = p.parse_args()
    L.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 20, generator=g)
    y = (x[:, :4].argmax(1) + (x[:, 4] > 0).long()) % 4
    loader: Any
    if args.stream:
        loader = DataLoader(Stream(x, y), batch_size=32, num_workers=args.num_workers)
    elif args.paired:
        loader = {
            "long": DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
            "short": DataLoader(TensorDataset(x[:480], y[:480]), batch_size=32, shuffle=True),
        }
    else:
        loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True,
                            num_workers=args.num_workers)  # fmt: skip
    trainer = L.Trainer(max_steps=args.max_steps, enable_progress_bar=False,
                        enable_model_summary=False, logger=False,
                        enable_checkpointing=False, callbacks=[SriftyCallback()])  # fmt: skip
    trainer.fit(Classifier(), loader)
    return 0


if __name__ == "__main__":
    sys.exit(main())
