"""The profile records what the training loader's workers spend per batch (real Trainer,
real DataLoader worker processes)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_srifty import SriftyCallback
from lightning_srifty.capture.loader_load import cpu_seconds

BATCH = 8
CPU_PER_SAMPLE_S = 0.002


class BurningDataset(Dataset[torch.Tensor]):
    """Each sample costs its worker at least ``CPU_PER_SAMPLE_S`` of CPU time (a decode)."""

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> torch.Tensor:
        _burn(CPU_PER_SAMPLE_S)
        return torch.full((4,), float(index % 7))


def _burn(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


class LateStart:
    """A ``worker_init_fn`` that costs each worker but the first ``seconds`` of CPU as it
    starts (its own imports, opening a dataset: a forkserver child on a busy machine),
    CPU that is not any batch's; the first worker's batch is trained meanwhile."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, worker_id: int) -> None:
        if worker_id:
            _burn(self.seconds)


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _profile(
    root: Path, workers: int, samples: int = 4096, window: int = 20, start_cpu_s: float = 0.0
) -> SriftyCallback:
    callback = SriftyCallback(warmup_steps=3, profile_steps=window, verbose=False)
    loader = DataLoader(
        BurningDataset(samples),
        batch_size=BATCH,
        num_workers=workers,
        multiprocessing_context="forkserver" if workers else None,
        worker_init_fn=LateStart(start_cpu_s) if start_cpu_s else None,
    )
    pl.Trainer(
        max_steps=window + 10,
        accelerator="cpu",
        devices=1,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        callbacks=[callback],
    ).fit(Tiny(), train_dataloaders=loader)
    return callback


def test_a_loader_with_workers_records_their_cpu_per_batch(tmp_path: Path) -> None:
    window = 40
    profile = _profile(tmp_path, workers=2, window=window).profile
    assert profile is not None and profile.data_loading is not None
    loading = profile.data_loading
    assert loading.workers == 2
    assert loading.batches == window
    burned = BATCH * CPU_PER_SAMPLE_S
    # The meter counts the CPU the workers spent between two readings against the
    # batches trained between them. Batches they fetched ahead before the first reading
    # (prefetch_factor=2 each, torch's default) are trained inside the window but made
    # before it, and each worker's reading is good to a clock tick (10 ms): so at least
    # what the other batches burned, less the ticks; and not wildly more, a worker's own
    # overhead per batch being small against 16 ms.
    ahead = 2 * loading.workers
    ticks = 0.01 * 2 * loading.workers
    lowest = (burned * (window - ahead) - ticks) / window
    assert lowest <= loading.cpu_s_per_batch <= 3 * burned
    assert lowest > burned / 2  # still fails a meter that missed one of the two workers


def test_a_loader_in_the_training_process_records_none(tmp_path: Path) -> None:
    profile = _profile(tmp_path, workers=0).profile
    assert profile is not None and profile.data_loading is None


def test_a_window_across_epochs_measures_each_set_of_workers_between_its_readings(
    tmp_path: Path,
) -> None:
    # epochs of 12 batches: the window's 20 batches see a new set of workers start, the
    # second spending 0.6 s of CPU on its start while the first's batch is trained (CI
    # once counted 0.4 s of a late start this way): counted, that adds about 0.05 s to
    # each of the ~11 batches
    profile = _profile(tmp_path, workers=2, samples=12 * BATCH, start_cpu_s=0.6).profile
    assert profile is not None and profile.data_loading is not None
    loading = profile.data_loading
    assert loading.workers == 2 and 8 <= loading.batches < 20
    burned = BATCH * CPU_PER_SAMPLE_S
    assert 0.5 * burned <= loading.cpu_s_per_batch <= 3 * burned


def test_epochs_within_the_workers_prefetch_measure_nothing(tmp_path: Path) -> None:
    # epochs of 5 batches: 2 workers fetch 4 ahead, so no set is read far enough apart
    profile = _profile(tmp_path, workers=2, samples=5 * BATCH).profile
    assert profile is not None and profile.data_loading is None


def test_a_process_that_is_gone_reads_as_unknown() -> None:
    assert cpu_seconds((os.getpid(),)) is not None
    assert cpu_seconds((os.getpid(), 2**22 + 12345)) is None
