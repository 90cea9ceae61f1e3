"""The launcher's resumable batch sampler: a resume continues at the exact batch."""

from __future__ import annotations

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from lightning_srifty.capture.resumable_sampler import ResumingBatchSampler, make_resumable

DATA = TensorDataset(torch.arange(40))
BATCHES = 10  # 40 samples in batches of 4


def _loader() -> DataLoader:
    loader = make_resumable(DataLoader(DATA, batch_size=4, shuffle=True))
    assert loader is not None
    return loader


def _epoch(loader: DataLoader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


def _sampler(loader: DataLoader) -> ResumingBatchSampler:
    sampler = loader.batch_sampler
    assert isinstance(sampler, ResumingBatchSampler)
    return sampler


def test_a_resume_mid_epoch_continues_at_the_next_batch() -> None:
    torch.manual_seed(0)
    loader = _loader()
    first = _epoch(loader)
    state = _sampler(loader).state_dict(3, world_size=1)
    again = _loader()
    _sampler(again).resume(state, world_size=1)
    assert _epoch(again) == first[3:]


def test_a_checkpoint_after_the_last_batch_starts_the_next_epoch_whole() -> None:
    """Saved at the epoch's last batch (the profiling window or a preemption ending
    there), Lightning resumes at the next epoch: it must be the uninterrupted run's next
    epoch, not an epoch with every batch skipped."""
    torch.manual_seed(0)
    loader = _loader()
    _epoch(loader)
    state = _sampler(loader).state_dict(BATCHES, world_size=1)
    rng = torch.get_rng_state()
    uninterrupted = _epoch(loader)
    torch.set_rng_state(rng)  # the checkpoint restores the global generator
    resumed = _loader()
    _sampler(resumed).resume(state, world_size=1)
    assert len(uninterrupted) == BATCHES
    assert _epoch(resumed) == uninterrupted


def test_the_sampler_keeps_the_loaders_batching() -> None:
    inner = BatchSampler(RandomSampler(DATA), batch_size=4, drop_last=False)
    assert len(ResumingBatchSampler(inner)) == BATCHES
