"""A LightningModule that logs five ways, for tests of per-step ``sync_dist`` values.

``python synced_logs.py PROFILE.json``: one process under ``SriftyCallback``, the
profile written to PROFILE.json. ``torchrun --nproc-per-node 2 synced_logs.py -``: DDP
on gloo, no callback; rank zero prints how many ``torch.distributed.all_reduce`` calls
its tenth step made (DDP's gradient buckets go through its reducer, not this function).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback

CALLS = [0]
_all_reduce = dist.all_reduce


def _counted(*args: Any, **kwargs: Any) -> Any:
    CALLS[0] += 1
    return _all_reduce(*args, **kwargs)


dist.all_reduce = _counted


class Logging(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(16, 4)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.layer(x), y)
        self.log("loss", loss, sync_dist=True)  # on_step by default in training_step
        self.log("both", loss, on_step=True, on_epoch=True, sync_dist=True)
        self.log("epoch_only", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log("unsynced", loss)
        self.log("rank_zero", loss, sync_dist=True, rank_zero_only=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class StepCalls(pl.Callback):
    def on_train_batch_start(self, *args: Any) -> None:
        self.before = CALLS[0]

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == 10 and trainer.global_rank == 0:
            print(f"all_reduce calls in a step: {CALLS[0] - self.before}", flush=True)


def main(profile: str) -> None:
    x = torch.randn(1024, 16, generator=torch.Generator().manual_seed(0))
    callbacks: list[pl.Callback] = [StepCalls()]
    if profile != "-":
        callbacks.append(SriftyCallback(warmup_steps=2, profile_steps=4, profile_path=profile))
    # under torchrun: DDP over its processes
    shape = {"strategy": "ddp", "devices": int(os.environ["LOCAL_WORLD_SIZE"])} if (
        "LOCAL_WORLD_SIZE" in os.environ) else {}  # fmt: skip
    trainer = pl.Trainer(max_steps=12, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False,
                         callbacks=callbacks, **shape)  # fmt: skip
    trainer.fit(Logging(), DataLoader(TensorDataset(x, x[:, :4].argmax(1)), batch_size=32))


if __name__ == "__main__":
    main(sys.argv[1])
