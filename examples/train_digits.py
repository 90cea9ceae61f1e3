"""Train an MLP on scikit-learn's digits with lightning-srifty's profiler attached.

    python examples/train_digits.py --max-steps 60
    torchrun --nproc-per-node 2 examples/train_digits.py
    srifty-launch --backend local --yes --target-steps 300 examples/train_digits.py

The only srifty line is ``callbacks=[SriftyCallback(...)]``; the profile lands in
``<default-root-dir>/srifty/profile.json`` (or ``$SRIFTY_PROFILE_PATH``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import lightning.pytorch as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from digits import DigitsDataModule, DigitsModule  # noqa: E402

from lightning_srifty import SriftyCallback  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--max-steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--default-root-dir", default="runs/digits")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--profile-steps", type=int, default=20)
    return p.parse_args(argv)


def topology(args: argparse.Namespace) -> tuple[int, int]:
    """(devices per node, nodes): from torchrun's environment when it started us."""
    if "LOCAL_WORLD_SIZE" in os.environ and "WORLD_SIZE" in os.environ:
        local = int(os.environ["LOCAL_WORLD_SIZE"])
        return local, max(1, int(os.environ["WORLD_SIZE"]) // local)
    return args.devices, 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pl.seed_everything(args.seed, workers=True)
    devices, num_nodes = topology(args)
    trainer = pl.Trainer(
        max_steps=args.max_steps,
        accelerator=args.accelerator,
        devices=devices,
        num_nodes=num_nodes,
        strategy="ddp" if devices * num_nodes > 1 else "auto",
        deterministic=True,
        default_root_dir=args.default_root_dir,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        callbacks=[
            SriftyCallback(warmup_steps=args.warmup_steps, profile_steps=args.profile_steps)
        ],
    )
    trainer.fit(
        DigitsModule(hidden=args.hidden),
        datamodule=DigitsDataModule(batch_size=args.batch_size, seed=args.seed),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
