"""Overhead of SriftyCallback on step time, inside the profiling window and after it.

Trains the same model with and without the callback, interleaving short repetitions
in ABBA order so drift in machine load hits both arms equally. Each run times its
own steps with a minimal timer callback, then compares medians per step index:

* inside the window (hooks active): target ratio <= 1.10 on CPU;
* after the window (hooks removed): target ratio <= 1.01.

    .venv/bin/python benchmarks/bench_callback_overhead.py [--reps 6] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_srifty import SriftyCallback

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _digits() -> Any:
    spec = importlib.util.spec_from_file_location("digits", EXAMPLES / "digits.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["digits"] = module
    spec.loader.exec_module(module)
    return module


class StepTimer(pl.Callback):
    """Wall time of each training step, batch start to batch end.

    On CUDA it synchronizes at both ends, so the time is the GPU's and not only the
    launches'; both arms pay the same two synchronizations.
    """

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    @staticmethod
    def _sync() -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def on_train_batch_start(self, *args: Any) -> None:
        self._sync()
        self._start = time.perf_counter()

    def on_train_batch_end(self, *args: Any) -> None:
        self._sync()
        self.times.append(time.perf_counter() - self._start)


def run_once(digits: Any, with_callback: bool, args: argparse.Namespace, root: str) -> list[float]:
    pl.seed_everything(0, verbose=False)
    timer = StepTimer()
    callbacks: list[pl.Callback] = [timer]
    if with_callback:
        callbacks.append(
            SriftyCallback(
                warmup_steps=args.warmup,
                profile_steps=args.window,
                profile_path=Path(root) / "profile.json",
                env={"SRIFTY_IMDS": "off"},
                verbose=False,
            )
        )
    trainer = pl.Trainer(
        max_steps=args.warmup + args.window + args.after,
        accelerator=args.accelerator,
        devices=1,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
    )
    trainer.fit(
        digits.DigitsModule(hidden=args.hidden, depth=args.depth),
        datamodule=digits.DigitsDataModule(batch_size=args.batch_size),
    )
    return timer.times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--after", type=int, default=40)
    p.add_argument("--accelerator", default="cpu", help="cpu or gpu")
    args = p.parse_args()
    os.environ.setdefault("SRIFTY_IMDS", "off")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    digits = _digits()
    window = slice(args.warmup, args.warmup + args.window)
    after = slice(args.warmup + args.window + 2, None)  # skip the write step and one more
    per_arm: dict[bool, dict[str, list[float]]] = {
        False: {"window": [], "after": []},
        True: {"window": [], "after": []},
    }
    with tempfile.TemporaryDirectory() as root:
        run_once(digits, True, args, root)  # warm caches, imports, allocator
        for rep in range(args.reps):
            # ABBA order: neither arm always runs second (warmer caches, later drift)
            for arm in (False, True) if rep % 2 == 0 else (True, False):
                times = run_once(digits, arm, args, root)
                per_arm[arm]["window"].append(statistics.median(times[window]))
                per_arm[arm]["after"].append(statistics.median(times[after]))
    print(
        f"torch {torch.__version__} on {args.accelerator}"
        f"{' ' + torch.cuda.get_device_name() if args.accelerator == 'gpu' else ''}, "
        f"threads {torch.get_num_threads()}, model hidden="
        f"{args.hidden} depth={args.depth} batch={args.batch_size}, reps={args.reps}"
    )
    for phase, target in (("window", 1.10), ("after", 1.01)):
        base = statistics.median(per_arm[False][phase])
        prof = statistics.median(per_arm[True][phase])
        ratio = prof / base
        verdict = "ok" if ratio <= target else "OVER TARGET"
        pairs = [w / wo for w, wo in zip(per_arm[True][phase], per_arm[False][phase], strict=True)]
        print(f"{phase:>6}: without {base * 1e3:7.3f} ms/step, with {prof * 1e3:7.3f} ms/step, "
              f"ratio {ratio:.3f} (target <= {target:.2f}) {verdict}; per-rep ratios "
              f"{min(pairs):.3f}..{max(pairs):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
