"""The launcher's resumable loaders: a resume continues at the exact batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
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


class _Noisy(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Each sample with noise drawn by whichever process loads it (an augmentation)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> torch.Tensor:
        return index + torch.rand(())


class _NoisyStream(IterableDataset):  # type: ignore[type-arg]
    """40 numbers with noise, each worker reading its own share (by worker id)."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = torch.utils.data.get_worker_info()
        mine = range(40) if info is None else range(info.id, 40, info.num_workers)
        return (i + torch.rand(()) for i in mine)


def _in_workers(dataset: object) -> DataLoader:
    loader = make_resumable(
        DataLoader(dataset, batch_size=4, shuffle=not isinstance(dataset, IterableDataset),
                   num_workers=2, multiprocessing_context="forkserver"),
        lambda: 0,
    )  # fmt: skip
    assert loader is not None
    return loader


@pytest.mark.parametrize("dataset", [_Noisy(), _NoisyStream()], ids=["map-style", "stream"])
def test_a_resume_draws_what_the_workers_drew_in_the_uninterrupted_epoch(dataset: object) -> None:
    """Workers seed from a base seed their iterator draws when it is created, and their
    draws advance with each sample they load: a resumed loader draws the same base seed
    from the state its checkpoint kept, and its workers load the batches done again."""
    torch.manual_seed(0)
    uninterrupted = _in_workers(dataset)
    position: Any = (
        uninterrupted if isinstance(uninterrupted, ResumingStreamLoader)
        else uninterrupted.batch_sampler
    )  # fmt: skip
    batches = iter(uninterrupted)
    done = [next(batches) for _ in range(3)]
    state, base = position.position(3, world_size=1), position.worker_base_state(3)
    rest = [b.tolist() for b in batches]
    torch.manual_seed(1)  # elsewhere, as a new process's generator is
    resumed = _in_workers(dataset)
    held: Any = resumed if isinstance(resumed, ResumingStreamLoader) else resumed.batch_sampler
    held.resume(state, world_size=1, base_state=base)
    assert len(done) == 3 and len(rest) == BATCHES - 3
    assert [b.tolist() for b in resumed] == rest


def test_a_stream_is_left_alone_without_the_trainers_epoch() -> None:
    assert make_resumable(DataLoader(_Stream(), batch_size=4)) is None


def _two_loaders(epoch: list[int]) -> tuple[DataLoader, DataLoader]:
    """A long loader (10 batches) and a short one (3 batches, cycled), both shuffled."""
    long = make_resumable(DataLoader(DATA, batch_size=4, shuffle=True), lambda: epoch[0])
    short = make_resumable(
        DataLoader(TensorDataset(torch.arange(100, 112)), batch_size=4, shuffle=True),
        lambda: epoch[0],
    )
    assert long is not None and short is not None
    return long, short


def _combined(long: DataLoader, short: DataLoader) -> Iterator[list[list[int]]]:
    """What Lightning trains on from a dict of training loaders: its own CombinedLoader
    in ``max_size_cycle`` mode, the short loader starting a new pass when it runs out.
    Its loader iterators are created here, as Lightning's ``setup_data`` does."""
    from lightning.pytorch.utilities import CombinedLoader

    combined = iter(CombinedLoader({"a": long, "b": short}, "max_size_cycle"))
    return ([batch["a"][0].tolist(), batch["b"][0].tolist()] for batch, _, _ in combined)


@pytest.mark.parametrize("done", [2, 4, 6, 7, 9])
def test_a_shorter_loader_of_several_resumes_in_the_pass_it_stood_in(done: int) -> None:
    """A dict of loaders: the short one draws a new order for each pass over its 3
    batches; the resumed run goes on in the pass it stood in, at its batch, and its later
    passes draw their orders as the uninterrupted run did. As in Lightning, a sized
    loader is not fetched ahead, and a resumed run creates its loader iterators before
    the callback restores the generators (``on_train_start``). At 6 the short loader had
    ended its second pass: the uninterrupted run makes a new iterator for the third."""
    epoch = [1]
    torch.manual_seed(0)
    long, short = _two_loaders(epoch)
    run = _combined(long, short)
    seen = [next(run) for _ in range(done)]
    states = [_sampler(x).position(done, world_size=1) for x in (long, short)]
    rng = torch.get_rng_state()
    uninterrupted = list(run)
    resumed = _two_loaders(epoch)
    for loader, state in zip(resumed, states, strict=True):
        _sampler(loader).resume(state, world_size=1)
    again = _combined(*resumed)
    torch.set_rng_state(rng)  # what the checkpoint's callback state restores
    assert len(seen) + len(uninterrupted) == BATCHES
    assert list(again) == uninterrupted


def test_the_passes_of_a_closed_epoch_are_not_counted_in_the_next() -> None:
    """Lightning calls ``set_epoch`` on the inner sampler, not on ours: the Trainer's
    epoch tells a new epoch's passes from the last one's."""
    epoch = [0]
    torch.manual_seed(0)
    long, short = _two_loaders(epoch)
    list(_combined(long, short))
    epoch[0] = 1
    run = _combined(long, short)
    next(run), next(run)
    state = _sampler(short).position(2, world_size=1)
    assert state["epoch"] == 1 and state["batches"] == 2 and state["before"] == 0


def test_a_pass_a_resume_ended_at_once_still_counts_its_batches() -> None:
    """Resumed where the short loader had ended its second pass (6 batches: 3 + 3), the
    resumed pass ends at once; the next pass's checkpoint must still count the 6 batches
    before it, as the uninterrupted run's does (a second resume would otherwise start
    the pass at the wrong batch)."""
    epoch = [1]
    torch.manual_seed(0)
    long, short = _two_loaders(epoch)
    run = _combined(long, short)
    for _ in range(6):
        next(run)
    states = [_sampler(x).position(6, world_size=1) for x in (long, short)]
    rng = torch.get_rng_state()
    next(run)
    uninterrupted = _sampler(short).position(7, world_size=1)
    resumed = _two_loaders(epoch)
    for loader, state in zip(resumed, states, strict=True):
        _sampler(loader).resume(state, world_size=1)
    again = _combined(*resumed)
    torch.set_rng_state(rng)
    next(again)
    assert _sampler(resumed[1]).position(7, world_size=1) == uninterrupted


@pytest.fixture
def persistent() -> Iterator[Callable[[list[int]], DataLoader]]:
    """Makes launcher loaders over persistent workers (epoch from ``epoch[0]``), whose
    workers are stopped when the test ends, failed or not: a failure's traceback keeps
    the loader alive, and workers joined at the interpreter's exit are never told."""
    made: list[DataLoader] = []

    def make(epoch: list[int]) -> DataLoader:
        loader = make_resumable(
            DataLoader(_Noisy(), batch_size=4, shuffle=True, num_workers=2,
                       persistent_workers=True, multiprocessing_context="forkserver"),
            lambda: epoch[0],
        )  # fmt: skip
        assert loader is not None
        made.append(loader)
        return loader

    yield make
    for loader in made:
        workers = getattr(loader, "_iterator", None)
        if workers is not None:
            workers._shutdown_workers()  # what Lightning does at the end of fit


def _split_in_epoch_1(
    persistent: Callable[[list[int]], DataLoader], uninterrupted: DataLoader, epoch: list[int]
) -> tuple[list[Any], Any, list[Any], list[Any]]:
    """Epoch 1 of ``uninterrupted`` checkpointed after 3 batches and resumed on a new
    loader: (the 3 batches, the saved worker state, the rest, the resumed batches)."""
    epoch[0] = 1
    batches = iter(uninterrupted)
    done = [next(batches).tolist() for _ in range(3)]
    sampler = _sampler(uninterrupted)
    state, base = sampler.position(3, world_size=1), sampler.worker_base_state(3)
    rest = [b.tolist() for b in batches]
    torch.manual_seed(1)  # elsewhere, as a new process's generator is
    resumed = persistent(epoch)
    _sampler(resumed).resume(state, world_size=1, base_state=base)
    return done, base, rest, [b.tolist() for b in resumed]


def test_persistent_workers_resume_with_the_draws_they_carried_from_the_epoch_before(
    persistent: Callable[[list[int]], DataLoader],
) -> None:
    """Persistent workers keep their generators from epoch to epoch: a resume inside the
    second epoch starts its workers from the generators they reported as it began."""
    torch.manual_seed(0)
    epoch = [0]
    uninterrupted = persistent(epoch)
    first = [b.tolist() for b in uninterrupted]
    done, base, rest, again = _split_in_epoch_1(persistent, uninterrupted, epoch)
    assert isinstance(base, dict) and len(base["workers"]) == 2
    assert len(first) == BATCHES and len(done) == 3
    assert again == rest


def test_a_pass_after_one_left_before_its_end_resumes_with_what_that_one_loaded(
    persistent: Callable[[list[int]], DataLoader],
) -> None:
    """Workers left with batches under way load them before the next pass begins (their
    generators advance, and PyTorch discards the batches): in an epoch that reloads its
    loaders Lightning leaves its first iterator after the prefetch. Those batches report
    too, so a resume inside the next pass starts the workers where they were."""
    torch.manual_seed(0)
    epoch = [0]
    uninterrupted = persistent(epoch)
    next(iter(uninterrupted))  # the rest of the pass is prefetched, then dropped
    done, base, rest, again = _split_in_epoch_1(persistent, uninterrupted, epoch)
    assert isinstance(base, dict)
    assert len(done) == 3 and again == rest
