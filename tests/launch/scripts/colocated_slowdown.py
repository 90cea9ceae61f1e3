"""The digits example with an injected slowdown of co-located processes.

Used by the live-refinement test: every process sleeps ``--colocated-sleep`` seconds
per batch when more than one process of the job runs on its node (torchrun's
``LOCAL_WORLD_SIZE``), as a job whose data loading saturates a shared host would. A
plan with one process per node runs at full speed.

    python colocated_slowdown.py [--colocated-sleep 0.2] [train_digits options]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
sys.path.insert(0, str(EXAMPLES))

from digits import DigitsDataModule, DigitsModule  # noqa: E402

from lightning_srifty import SriftyCallback  # noqa: E402


class ColocatedSleep(pl.Callback):
    """Sleeps after every batch while this node runs several of the job's processes."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1 else 0.0

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        if self.seconds:
            time.sleep(self.seconds)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--colocated-sleep", type=float, default=0.2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    pl.seed_everything(0, workers=True)
    trainer = pl.Trainer(
        deterministic=True,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        callbacks=[
            SriftyCallback(warmup_steps=3, profile_steps=10),
            ColocatedSleep(args.colocated_sleep),
        ],
    )
    trainer.fit(
        DigitsModule(hidden=args.hidden),
        datamodule=DigitsDataModule(batch_size=args.batch_size, seed=0),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
