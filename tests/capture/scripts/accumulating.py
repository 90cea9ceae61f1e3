"""A Lightning job that accumulates gradients over three batches (tests only).

Dropout and a shuffled loader of 10 batches an epoch (so an epoch's last batch steps
the optimizer alone; under torchrun, 5 batches an epoch on each of two processes), SGD
with momentum and the callback. ``LOSS_LOG=<file>`` gets ``batches-done loss`` per
batch, each loss with every digit, on rank zero. ``--sigterm-at N`` makes rank
``--sigterm-rank`` send itself SIGTERM inside its N-th batch of the run, as a spot VM's
shutdown would (batches count from the run's start, restored ones included).
``STEP_SLEEP_S=<s>`` makes every batch take at least that long (the losses do not change).
``HANG_AT=<n>`` makes batch ``n`` hang (in ``hang_here``) until the process is killed.

``--accumulate K`` sets ``accumulate_grad_batches`` (3); ``--schedule`` instead
accumulates by Lightning's ``GradientAccumulationScheduler``, 1 batch for the first two
epochs and 3 from the third; ``--swa-from E`` adds Lightning's
``StochasticWeightAveraging`` from epoch ``E`` (1-based, its own convention);
``--plateau`` validates each epoch and halves the learning rate by ``ReduceLROnPlateau``
on the validation loss. ``--augment-workers N`` loads the batches in N DataLoader workers
(from a fork server), each sample with a random shift drawn there, and seeds each rank apart (rank
``r`` from seed ``r``), so every rank's workers draw from a base seed of their own.
``--persistent`` keeps those workers from epoch to epoch. ``--seeded`` gives that loader
a generator of its own, seeded apart per rank (``100 + r``), which draws its workers'
base seeds. ``--reload-every N`` sets
``reload_dataloaders_every_n_epochs``; each build then trains on a random 128 of the 160
samples, drawn from the global generator (ranks seeded apart as for
``--augment-workers``, so every rank draws a subset of its own).

    python accumulating.py [--sigterm-at N] [--sigterm-rank R] [--accumulate K | --schedule]
                           [--swa-from E] [--plateau] [--augment-workers N]
                           [--persistent] [--seeded] [--reload-every N]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import GradientAccumulationScheduler, StochasticWeightAveraging
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback


class Shifted(TensorDataset):
    """Each sample shifted by noise drawn from the loading process's generators."""

    def __getitem__(self, index: int) -> Any:
        x, y = super().__getitem__(index)
        return x + 0.1 * torch.randn(8) + random.uniform(-0.1, 0.1), y


def hang_here() -> None:
    """A stuck step, as a collective that never completes would leave one."""
    while True:
        time.sleep(3600)


class Accumulating(pl.LightningModule):
    def __init__(
        self,
        sigterm_at: int,
        sigterm_rank: int,
        plateau: bool = False,
        workers: int = 0,
        subsets: bool = False,
        persistent: bool = False,
        seeded: bool = False,
    ) -> None:
        super().__init__()
        self.sigterm_at, self.sigterm_rank, self.plateau = sigterm_at, sigterm_rank, plateau
        self.workers, self.subsets, self.persistent = workers, subsets, persistent
        # the loader's own generator, seeded apart per rank: its workers' base seeds
        rank = int(os.environ.get("RANK", "0"))
        self.generator = torch.Generator().manual_seed(100 + rank) if seeded else None
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3),
                                       torch.nn.Linear(16, 2))  # fmt: skip

    def train_dataloader(self) -> Any:
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(160, 8, generator=g), torch.randint(0, 2, (160,), generator=g)
        if self.subsets:
            chosen = torch.randperm(160)[:128]
            x, y = x[chosen], y[chosen]
        if self.workers:
            shifted = Shifted(x, y)
            context = "forkserver"
            return DataLoader(shifted, batch_size=16, shuffle=True, num_workers=self.workers,
                              multiprocessing_context=context, generator=self.generator,
                              persistent_workers=self.persistent)  # fmt: skip
        return DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)

    def val_dataloader(self) -> Any:
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(32, 8, generator=g), torch.randint(0, 2, (32,), generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=16) if self.plateau else []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        time.sleep(float(os.environ.get("STEP_SLEEP_S", "0")))
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        done = self.current_epoch * int(self.trainer.num_training_batches) + batch_idx + 1
        if done == int(os.environ.get("HANG_AT", "0")):
            hang_here()
        if done == self.sigterm_at and self.global_rank == self.sigterm_rank:
            os.kill(os.getpid(), signal.SIGTERM)
        log = os.environ.get("LOSS_LOG")
        if log and self.global_rank == 0:
            with open(log, "a") as fh:
                fh.write(f"{done} {float(loss.detach()).hex()}\n")
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        if not self.plateau:
            return optimizer
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, threshold=0.5)
        scheduler = {"scheduler": plateau, "monitor": "val_loss"}
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sigterm-at", type=int, default=0)
    parser.add_argument("--sigterm-rank", type=int, default=0)
    parser.add_argument("--accumulate", type=int, default=3)
    parser.add_argument("--swa-from", type=int, default=0)
    parser.add_argument("--schedule", action="store_true")
    parser.add_argument("--plateau", action="store_true")
    parser.add_argument("--augment-workers", type=int, default=0)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--seeded", action="store_true")
    parser.add_argument("--reload-every", type=int, default=0)
    args = parser.parse_args()
    apart = args.augment_workers or args.reload_every
    pl.seed_everything(int(os.environ.get("RANK", "0")) if apart else 0)
    # devices and strategy: the launcher's PL_TRAINER_* defaults, as for any script
    callbacks: list[pl.Callback] = [SriftyCallback(warmup_steps=1, profile_steps=2, verbose=False)]
    if args.schedule:
        callbacks.append(GradientAccumulationScheduler(scheduling={0: 1, 2: 3}))
        args.accumulate = 1  # the scheduler requires the Trainer's default
    if args.swa_from:
        callbacks.append(StochasticWeightAveraging(swa_lrs=0.5, swa_epoch_start=args.swa_from,
                                                   annealing_epochs=3))  # fmt: skip
    pl.Trainer(accelerator="cpu", accumulate_grad_batches=args.accumulate, logger=False,
               enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, reload_dataloaders_every_n_epochs=args.reload_every,
               callbacks=callbacks,
               ).fit(Accumulating(args.sigterm_at, args.sigterm_rank, args.plateau,
                                  args.augment_workers, args.reload_every > 0,
                                  args.persistent, args.seeded))  # fmt: skip


if __name__ == "__main__":
    main()
