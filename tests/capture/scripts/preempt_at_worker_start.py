"""A Lightning job preempted at the worst moment for its DataLoader workers (tests only).

The notice is a SIGTERM to the job's whole process group, as SkyPilot's cancel
(``os.killpg`` in ``sky/skylet/job_lib.py``) and a VM's shutdown send it. It is sent
from inside a new DataLoader worker right after PyTorch installed that worker's own
signal handlers and before its ``worker_init_fn`` runs: the window in which a worker
started at an epoch boundary used to die of a preemption. A hook, not timing luck,
puts the signal there, every time.

Environment (inherited by the workers, whatever their start method):

* ``PREEMPT_ARM``: a file; the first worker to start while it exists removes it and
  sends the signal (so there is exactly one preemption). The job creates it at the end
  of epoch ``--arm-after-epoch`` (workers started for the next epoch fire it); the test
  creates it beforehand to fire at the very first workers.
* ``PREEMPT_SENT``: a file the firing worker writes its pid to as it sends the signal.
* ``TRACE_BATCHES``: a file that gets a line per training batch the job ran.

    python preempt_at_worker_start.py --context fork [--persistent] [--arm-after-epoch N]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data._utils import signal_handling

from lightning_srifty import SriftyCallback

_install_worker_handlers = signal_handling._set_worker_signal_handlers


def _install_then_preempt(*args: Any) -> None:
    """PyTorch's worker-side handlers, then (once) a SIGTERM to the whole group."""
    _install_worker_handlers(*args)
    try:
        os.remove(os.environ["PREEMPT_ARM"])
    except (KeyError, FileNotFoundError):
        return  # not armed, or another worker fired already
    Path(os.environ["PREEMPT_SENT"]).write_text(str(os.getpid()))
    os.killpg(os.getpgrp(), signal.SIGTERM)


# At import, so that workers of every start method run it: a forked worker inherits the
# patched module, a spawned or forkserver one imports this script as ``__mp_main__``.
signal_handling._set_worker_signal_handlers = _install_then_preempt


class Regression(L.LightningModule):
    def __init__(self, arm_after_epoch: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.arm_after_epoch = arm_after_epoch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        with open(os.environ["TRACE_BATCHES"], "a") as fh:
            fh.write(f"{self.current_epoch} {batch_idx}\n")
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_train_epoch_end(self) -> None:
        if self.current_epoch == self.arm_after_epoch:
            Path(os.environ["PREEMPT_ARM"]).touch()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--context", choices=["fork", "spawn", "forkserver"], default="fork")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--arm-after-epoch", type=int, default=-1)
    args = p.parse_args()
    L.seed_everything(0)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(
        TensorDataset(x, x.sum(dim=1, keepdim=True)),
        batch_size=8,
        shuffle=True,
        num_workers=2,
        persistent_workers=args.persistent,
        multiprocessing_context=args.context,
    )
    trainer = L.Trainer(
        max_epochs=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[SriftyCallback(verbose=False)],
    )
    trainer.fit(Regression(args.arm_after_epoch), loader)
    return 0


if __name__ == "__main__":
    sys.exit(main())
