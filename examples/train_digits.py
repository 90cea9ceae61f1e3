"""Train an MLP on scikit-learn's digits with lightning-srifty's profiler attached.

    python examples/train_digits.py --max-steps 60
    srifty-launch examples/train_digits.py --target-steps 300 --backend local --yes

The only srifty line is ``callbacks=[SriftyCallback(...)]``. Nothing else in the script
knows about srifty: under ``srifty-launch`` the same ``Trainer`` becomes a DDP job of
the plan's world size, because Lightning reads ``PL_TRAINER_DEVICES``,
``PL_TRAINER_NUM_NODES`` and ``PL_TRAINER_STRATEGY`` as the defaults of the arguments
a script leaves out. By hand that is::

    PL_TRAINER_DEVICES=2 PL_TRAINER_STRATEGY=ddp torchrun --nproc-per-node 2 \
        examples/train_digits.py --max-steps 60

The profile lands in ``<default_root_dir>/srifty/profile.json`` (or ``$SRIFTY_PROFILE_PATH``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lightning.pytorch as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from digits import DigitsDataModule, DigitsModule  # noqa: E402

from lightning_srifty import SriftyCallback  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--max-epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--profile-steps", type=int, default=20)
    p.add_argument("--min-measure-s", type=float, default=0.5)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pl.seed_everything(args.seed, workers=True)
    trainer = pl.Trainer(
        max_steps=args.max_steps,
        max_epochs=args.max_epochs,
        deterministic=True,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        callbacks=[
            SriftyCallback(
                warmup_steps=args.warmup_steps,
                profile_steps=args.profile_steps,
                min_measure_s=args.min_measure_s,
            )
        ],
    )
    trainer.fit(
        DigitsModule(hidden=args.hidden),
        datamodule=DigitsDataModule(batch_size=args.batch_size, seed=args.seed),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
