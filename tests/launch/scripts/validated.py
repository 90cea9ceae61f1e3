"""A Lightning script with a validation set, checked at every epoch's end, plus the callback.

40 training batches an epoch and 5 validation batches a pass by default;
``VAL_SLEEP_S=<s>`` makes every validation batch take at least that long (a pass worth
pricing on any machine), ``TRAIN_SLEEP_S=<s>`` every training batch.
``HANG_AT_STEP=<n>`` with ``HANG_MARKER=<path>``: the first process to reach optimizer
step n hangs there for good (a deadlock), once: it leaves the marker file behind.
``HANG_AT_SETUP_MARKER=<path>``: the first training attempt (not the profiling run)
hangs for good in ``setup``, before its first progress line, once (a DataLoader worker
stuck in its fork at the start looks the same: nothing written, ever).
``SETUP_SLEEP_S=<s>``: every run's ``setup`` is silent that long (a dataset loading).
``benchmarks/bench_validation_pricing.py`` sizes it with the flags below
(``--val-samples 0`` turns validation off). ``--early-stop-patience P`` adds Lightning's
``EarlyStopping`` on ``val_loss`` with a ``min_delta`` no pass meets: training stops
after P + 1 epochs, by the script's own rule. ``--max-time S`` sets
``Trainer(max_time=...)`` to S seconds.

    python validated.py [--max-epochs N] [--train-samples N] [--val-samples N]
                        [--width W] [--num-workers W] [--early-stop-patience P]
                        [--profile-steps N] [--max-time S]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback


class Regressor(L.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width),
                                 nn.ReLU(), nn.Linear(width, 1))  # fmt: skip

    def setup(self, stage: str) -> None:
        time.sleep(float(os.environ.get("SETUP_SLEEP_S", "0")))
        marker = os.environ.get("HANG_AT_SETUP_MARKER", "")
        training = os.environ.get("SRIFTY_MODE") == "train"
        if marker and training and not os.path.exists(marker):
            open(marker, "w").close()
            while True:
                time.sleep(3600)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(float(os.environ.get("TRAIN_SLEEP_S", "0")))
        hang_at, marker = os.environ.get("HANG_AT_STEP"), os.environ.get("HANG_MARKER", "")
        if hang_at and self.global_step == int(hang_at) and not os.path.exists(marker):
            open(marker, "w").close()
            while True:
                time.sleep(3600)
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
    p.add_argument("--train-samples", type=int, default=160)
    p.add_argument("--val-samples", type=int, default=20)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--early-stop-patience", type=int, default=None)
    p.add_argument("--profile-steps", type=int, default=None)
    p.add_argument("--max-time", type=float, default=None)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    n, v = args.train_samples, args.val_samples
    train = TensorDataset(torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g))
    val = TensorDataset(torch.randn(v, 16, generator=g), torch.randn(v, 1, generator=g))
    window = {} if args.profile_steps is None else {"profile_steps": args.profile_steps}
    callbacks: list[L.Callback] = [SriftyCallback(**window)]
    if args.early_stop_patience is not None:
        callbacks.append(EarlyStopping("val_loss", patience=args.early_stop_patience,
                                       min_delta=1e9))  # fmt: skip
    max_time = None if args.max_time is None else {"seconds": args.max_time}
    trainer = L.Trainer(max_epochs=args.max_epochs, max_time=max_time, enable_progress_bar=False,
                        enable_model_summary=False, logger=False, enable_checkpointing=False,
                        limit_val_batches=1.0 if v else 0, callbacks=callbacks)  # fmt: skip
    workers = {"num_workers": args.num_workers}
    trainer.fit(Regressor(args.width), DataLoader(train, batch_size=4, shuffle=True, **workers),
                DataLoader(val, batch_size=4, **workers) if v else None)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
