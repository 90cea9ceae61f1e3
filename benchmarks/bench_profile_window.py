"""How close a profile of tiny steps reads to the run it profiles, with and without the
profiling window's minimum time (``SriftyCallback(min_measure_s=...)``).

Trains the demo's model (``examples/digits.py``, the ``make demo`` job: hidden 256, batch
64, about 2 ms a step on a CPU core) with the callback's defaults, and times the same run
after the profile: the mean interval between batch ends from step ``--steady-from`` on,
data loading included, as the launcher's progress reports measure it. Arms alternate
(A B B A ...) so drift in the machine's load hits both alike. Prints each run's
profile/run ratio and, per arm, the median and worst ``|ratio - 1|``.

    .venv/bin/python benchmarks/bench_profile_window.py [--reps 6] [--steps 2500]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from lightning_srifty import SriftyCallback
from lightning_srifty.io.profile_io import load_profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_callback_overhead import _digits  # noqa: E402 - the same demo model loader


class BatchEnds(pl.Callback):
    """The wall clock at every batch end (the run's own step rate, loading included)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter())


def run_once(digits: Any, min_measure_s: float, args: argparse.Namespace) -> tuple[float, float]:
    """(profile's mean step, the run's mean step from ``--steady-from``) in seconds."""
    pl.seed_everything(0, verbose=False)
    with tempfile.TemporaryDirectory() as root:
        ends = BatchEnds()
        srifty = SriftyCallback(
            min_measure_s=min_measure_s,
            profile_path=Path(root) / "profile.json",
            env={"SRIFTY_IMDS": "off"},
            verbose=False,
        )
        trainer = pl.Trainer(
            max_steps=args.steps,
            accelerator="cpu",
            devices=1,
            default_root_dir=root,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            callbacks=[srifty, ends],
        )
        trainer.fit(
            digits.DigitsModule(hidden=args.hidden),
            datamodule=digits.DigitsDataModule(batch_size=args.batch_size),
        )
        profile = load_profile(Path(root) / "profile.json")
    tail = ends.ends[args.steady_from :]
    steady = (tail[-1] - tail[0]) / (len(tail) - 1)
    return profile.steps.step.mean_s, steady


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=6, help="runs per arm")
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--steady-from", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--floor", type=float, default=0.5, help="min_measure_s of arm B")
    args = parser.parse_args()
    if args.steady_from >= args.steps - 1:
        parser.error("--steady-from must be below --steps minus one")
    digits = _digits()
    arms = {"counts only (min_measure_s=0)": 0.0, f"min_measure_s={args.floor:g}": args.floor}
    order = [
        name for i in range(args.reps) for name in (list(arms) if i % 2 == 0 else list(arms)[::-1])
    ]
    ratios: dict[str, list[float]] = {name: [] for name in arms}
    for name in order:
        profiled, steady = run_once(digits, arms[name], args)
        ratios[name].append(profiled / steady)
        print(
            f"{name:<32} profile {profiled * 1e3:6.2f} ms  run {steady * 1e3:6.2f} ms  "
            f"profile/run {profiled / steady:5.2f}",
            flush=True,
        )
    print("-- |profile/run - 1| per arm:")
    for name, values in ratios.items():
        off = [abs(r - 1.0) for r in values]
        print(
            f"   {name:<32} median {100 * statistics.median(off):5.1f} %   "
            f"worst {100 * max(off):5.1f} %   ({len(values)} runs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
