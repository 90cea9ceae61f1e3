"""The launcher's resumable loaders: a resume continues at the exact batch."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, TensorDataset

from lightning_srifty.capture.resumable_sampler import (
    ResumingBatchSampler,
    ResumingStreamLoader,
    make_resumable,
)

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
    state = _sampler(loader).position(3, world_size=1)
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
    state = _sampler(loader).position(BATCHES, world_size=1)
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


class _Stream(IterableDataset):  # type: ignore[type-arg]
    """40 numbers in a fixed order each time it is read, as a file is."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(40))


def _stream(epoch: list[int]) -> ResumingStreamLoader:
    loader = make_resumable(DataLoader(_Stream(), batch_size=4), lambda: epoch[0])
    assert isinstance(loader, ResumingStreamLoader)
    return loader


def test_a_stream_resumed_mid_epoch_drops_the_batches_done() -> None:
    """PyTorch refuses a batch sampler for an ``IterableDataset``: the stream is
    rebuilt as a loader that skips, with its batching kept."""
    epoch = [2]
    whole = [b.tolist() for b in _stream(epoch)]
    state = _stream(epoch).position(3, world_size=2)
    resumed = _stream(epoch)
    resumed.resume(state, world_size=1)
    assert len(whole) == BATCHES
    assert [b.tolist() for b in resumed] == whole[3:]
    assert [b.tolist() for b in resumed] == whole  # the next epoch is whole again


def test_a_streams_checkpoint_from_a_closed_epoch_drops_nothing() -> None:
    """Saved at an epoch's last batch, Lightning resumes at the next epoch: a stream
    has no length to compare with, so the epoch decides."""
    epoch = [0]
    state = _stream(epoch).position(BATCHES, world_size=1)
    epoch[0] = 1
    resumed = _stream(epoch)
    resumed.resume(state, world_size=1)
    assert len([b.tolist() for b in resumed]) == BATCHES


def test_a_stream_is_left_alone_without_the_trainers_epoch() -> None:
    assert make_resumable(DataLoader(_Stream(), batch_size=4)) is None
