"""Does the loader's measured CPU per batch give the step it allows? (The floor the
performance model puts under every step: ``PerformanceModel._loader_floor_s``.)

A real Trainer on this machine's CPU trains a small model from a DataLoader whose
workers spend a known CPU time on each sample (a decode), at 1 and 2 workers, with a
light and a heavy training step. The callback records the workers' CPU per batch
(``profile.data_loading``). ``alone`` is that over ``min(workers, cores)``, the floor
before the training thread's share of the cores was counted; ``floor`` is the model's
(:func:`~lightning_srifty.core.perfmodel.loader_floor_s`): also at least the workers'
CPU plus the training thread's compute (the profile's compute at the batch, its data
wait left out) over the cores. The run's own step (the mean interval between batch
ends after the profile, data loading included) is measured beside them. Where the
loader sets the pace, floor and step should agree; where training does, the floor
should sit below the step.

Measured here (2 cores, 2 ms a sample, batch 8, nothing else running), two runs,
alone/step then floor/step: light training, 1 worker (loader-bound) 0.94, 0.94 and
0.93, 0.93; light, 2 workers 0.81, 0.87 and 0.78, 0.82; heavy, 1 worker
(training-bound) 0.71, 0.72 and 0.79, 0.79; heavy, 2 workers (workers and training
sharing both cores) 0.41, 0.92 and 0.41, 0.79.

    .venv/bin/python benchmarks/bench_loader_floor.py [--cpu-per-sample-ms 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_srifty import SriftyCallback
from lightning_srifty.core.perfmodel import (
    fit_compute_curve,
    loader_floor_s,
    training_thread_s,
)

BATCH = 8
STEPS = 160


class Decoding(Dataset[torch.Tensor]):
    """Each sample costs its worker ``cpu_s`` of CPU time."""

    def __init__(self, cpu_s: float) -> None:
        self.cpu_s = cpu_s

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> torch.Tensor:
        until = time.thread_time() + self.cpu_s
        while time.thread_time() < until:
            pass
        return torch.full((64,), float(index % 7))


class Model(pl.LightningModule):
    """A step of ``work`` matrix products of 64x64 per sample (the training's own time)."""

    def __init__(self, work: int) -> None:
        super().__init__()
        self.work = work
        self.layer = torch.nn.Linear(64, 64)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        x = batch
        for _ in range(self.work):
            x = torch.tanh(self.layer(x))
        return x.pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class BatchEnds(pl.Callback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter())


def run(workers: int, work: int, cpu_s: float) -> tuple[float, float, float, float]:
    """(workers' CPU per batch, that over the workers running at once, the model's floor,
    the run's measured step) in seconds."""
    callback = SriftyCallback(warmup_steps=5, profile_steps=40, verbose=False)
    ends = BatchEnds()
    loader = DataLoader(
        Decoding(cpu_s), batch_size=BATCH, num_workers=workers,
        multiprocessing_context="forkserver",
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as root:
        pl.Trainer(
            max_steps=STEPS, accelerator="cpu", devices=1, default_root_dir=Path(root),
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            logger=False, callbacks=[callback, ends],
        ).fit(Model(work), train_dataloaders=loader)  # fmt: skip
    profile = callback.profile
    assert profile is not None and profile.data_loading is not None, "no loader measured"
    cores = os.cpu_count() or 1
    per_batch = profile.data_loading.cpu_s_per_batch
    # the floor with no training thread counted, and the model's, which counts it
    workers_alone = float(loader_floor_s(per_batch, workers, float(cores), 0.0))
    at_batch = fit_compute_curve(profile).at(np.asarray([float(BATCH)]))
    trainer = training_thread_s(profile, at_batch)
    floor = float(loader_floor_s(per_batch, workers, float(cores), trainer)[0])
    after = ends.ends[60:]  # past the profile's window
    step = statistics.mean(b - a for a, b in zip(after, after[1:], strict=False))
    return per_batch, workers_alone, floor, step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cpu-per-sample-ms", type=float, default=2.0)
    args = parser.parse_args()
    cpu_s = args.cpu_per_sample_ms / 1e3
    torch.set_num_threads(1)
    print(f"{os.cpu_count()} cores; each sample costs its worker {args.cpu_per_sample_ms} ms "
          f"of CPU, {BATCH} a batch ({BATCH * args.cpu_per_sample_ms:.0f} ms)")  # fmt: skip
    print(f"{'training':<10}{'workers':>8}{'CPU/batch':>11}{'alone':>9}{'floor':>9}{'step':>9}"
          f"{'alone/step':>12}{'floor/step':>12}")  # fmt: skip
    for label, work in (("light", 1), ("heavy", 400)):
        for workers in (1, 2):
            per_batch, alone, floor, step = run(workers, work, cpu_s)
            print(f"{label:<10}{workers:>8}{1e3 * per_batch:>9.1f}ms{1e3 * alone:>7.1f}ms"
                  f"{1e3 * floor:>7.1f}ms{1e3 * step:>7.1f}ms{alone / step:>12.2f}"
                  f"{floor / step:>12.2f}")  # fmt: skip
    print("floor/step near 1 where the loader sets the pace; below 1 where training does")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
