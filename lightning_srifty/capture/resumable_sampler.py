"""A plain shuffled ``DataLoader`` that resumes at the exact batch, unchanged scripts and all.

Lightning restores a loader's position only when the loader itself is stateful. A plain
``DataLoader(shuffle=True)`` is not: after a resume it starts its epoch again, with a
new order. Its ``RandomSampler`` draws the order's seed from the global torch generator
when the epoch's iteration starts, so the resumed run, whose generator is elsewhere by
then, sees other batches than an uninterrupted one (the loss curve parts from
``python train.py`` at the first handover, step 25 under the launcher).

Under the launcher the callback rebuilds each plain training ``DataLoader`` around a
:class:`ResumingBatchSampler`. In a run that is not resumed it does what the original
does, draw for draw: the same seed taken from the global generator at the same moment,
the same order, the same batches. It remembers the epoch's seed; the callback stores it
with the number of batches done in the epoch in every checkpoint. A resumed run then
builds the same order from that seed, without drawing, and skips the batches done.
Under DDP (Lightning's ``DistributedSampler``, ordered by epoch alone) only the skip is
needed; on another world size the skip covers the same number of samples.

A plain ``DataLoader`` over an ``IterableDataset`` (a stream: no sampler to seed, and
PyTorch refuses a batch sampler for it) is rebuilt as a :class:`ResumingStreamLoader`
instead: a resumed run iterates the stream from the epoch's start again and drops the
batches each process had done, so a stream that yields the same batches each time it is
iterated (its own seed, a file, a shard by rank) continues at the exact batch; the
dropped batches are loaded, not trained on.

Left alone: loaders that are not a plain ``torch.utils.data.DataLoader`` (they may be
stateful already, like torchdata's ``StatefulDataLoader`` or
:class:`~lightning_srifty.ResumableLoader`), and loaders with a sampler of the user's
own that has a ``generator``. Randomness inside the dataset drawn from the global
generator in the main process is not replayed for the one batch Lightning fetches
ahead before a resume restores the generators.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

STATE_VERSION = 1


class ResumingBatchSampler:
    """Batches of an inner batch sampler; remembers the shuffle seed, resumes by skipping.

    Args:
        inner: The loader's own batch sampler (a ``BatchSampler`` over its sampler).
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sampler = getattr(inner, "sampler", None)
        """Where Lightning looks for ``set_epoch`` (a ``DistributedSampler`` under DDP)."""
        self.batch_size = getattr(inner, "batch_size", None)
        self.drop_last = getattr(inner, "drop_last", False)
        self.epoch = 0
        self.seed: int | None = None
        """The seed of this epoch's order (a ``RandomSampler`` without its own generator)."""
        self._pending: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        setter = getattr(self.sampler, "set_epoch", None)
        if setter is not None:
            setter(epoch)

    def resume(self, state: dict[str, Any], world_size: int) -> None:
        """Continue the epoch ``state`` describes at its next batch (on the next ``iter``)."""
        if state.get("state_version") != STATE_VERSION:
            return
        self._pending = dict(state, resumed_world=max(int(world_size), 1))
        self.epoch = int(state.get("epoch", 0))

    def position(self, batches_done: int, world_size: int) -> dict[str, Any]:
        """Where the epoch stands, for the checkpoint (not ``state_dict``: Lightning would
        take a loader part with that name for a stateful loader of its own)."""
        return {
            "state_version": STATE_VERSION,
            "epoch": self.epoch,
            "seed": self.seed,
            "batches": int(batches_done),
            "world_size": int(world_size),
        }

    def __iter__(self) -> Iterator[Any]:
        pending, self._pending = self._pending, None
        if pending is not None and int(pending.get("epoch", -1)) != self.epoch:
            pending = None  # the checkpoint closed its epoch: this one starts afresh
        skip = 0
        shuffled = isinstance(self.sampler, RandomSampler) and self.sampler.generator is None
        if pending is not None:
            done = int(pending.get("batches", 0)) * int(pending.get("world_size", 1))
            skip = math.ceil(done / pending["resumed_world"])
            if skip >= len(self.inner):
                # Saved after the epoch's last batch: Lightning resumes at the next epoch,
                # which must start afresh, not skip a whole epoch's worth of batches.
                pending, skip = None, 0
        if pending is not None:
            self.seed = pending.get("seed")
        elif shuffled:
            # exactly what RandomSampler.__iter__ draws when it has no generator
            self.seed = int(torch.empty((), dtype=torch.int64).random_().item())
        if shuffled and self.seed is not None:
            assert isinstance(self.sampler, RandomSampler)
            self.sampler.generator = torch.Generator().manual_seed(self.seed)
        try:
            for index, batch in enumerate(self.inner):
                if index >= skip:
                    yield batch
        finally:
            if shuffled:
                assert isinstance(self.sampler, RandomSampler)
                self.sampler.generator = None


class ResumingStreamLoader(DataLoader):  # type: ignore[type-arg]
    """A plain ``DataLoader`` over an ``IterableDataset`` that resumes by dropping batches.

    A stream has no order to seed and no length to check, so the position is the
    epoch and the batches this process had done in it; a resume in the same epoch
    iterates the stream from its start and drops that many batches before the first
    one Lightning sees. A checkpoint from an epoch that has closed (Lightning resumes
    at the next epoch) drops nothing. The count is per process: a stream that every
    process iterates whole, or that shards itself by rank, continues where it was.

    Args:
        current_epoch: The Trainer's epoch when the stream is iterated.
        *args, **kwargs: What ``DataLoader`` takes.
    """

    def __init__(self, *args: Any, current_epoch: Callable[[], int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._current_epoch = current_epoch
        self._pending: dict[str, Any] | None = None

    def resume(self, state: dict[str, Any], world_size: int) -> None:
        """Continue the epoch ``state`` describes at its next batch (on the next ``iter``)."""
        del world_size  # each process keeps its own count
        if state.get("state_version") == STATE_VERSION and state.get("stream") is True:
            self._pending = dict(state)

    def position(self, batches_done: int, world_size: int) -> dict[str, Any]:
        """Where the epoch stands, for the checkpoint."""
        return {
            "state_version": STATE_VERSION,
            "stream": True,
            "epoch": int(self._current_epoch()),
            "batches": int(batches_done),
            "world_size": int(world_size),
        }

    def __iter__(self) -> Any:
        iterator = super().__iter__()
        pending, self._pending = self._pending, None
        if pending is None or int(pending.get("epoch", -1)) != int(self._current_epoch()):
            return iterator  # not resumed, or the checkpoint closed its epoch
        for _ in range(int(pending.get("batches", 0))):
            try:
                next(iterator)
            except StopIteration:
                break  # a shorter stream than the one checkpointed: nothing left
        return iterator


def _loader_kwargs(loader: DataLoader) -> dict[str, Any]:  # type: ignore[type-arg]
    """What rebuilding ``loader`` keeps, its batching aside."""
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return kwargs


def make_resumable(
    loader: Any, current_epoch: Callable[[], int] | None = None
) -> DataLoader | None:  # type: ignore[type-arg]
    """A copy of a plain ``DataLoader`` that resumes at its exact batch: batches from a
    :class:`ResumingBatchSampler`, or for a stream (with ``current_epoch``) a
    :class:`ResumingStreamLoader`; ``None`` when the loader is left as it is."""
    if type(loader) is not DataLoader:
        return None
    if isinstance(loader.dataset, IterableDataset):
        if current_epoch is None:
            return None
        return ResumingStreamLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            drop_last=loader.drop_last,
            current_epoch=current_epoch,
            **_loader_kwargs(loader),
        )
    if not isinstance(loader.batch_sampler, BatchSampler):
        return None
    sampler = loader.batch_sampler.sampler
    if isinstance(sampler, RandomSampler) and sampler.generator is not None:
        return None  # the user seeds it: its order already repeats
    return DataLoader(
        loader.dataset,
        batch_sampler=ResumingBatchSampler(loader.batch_sampler),
        **_loader_kwargs(loader),
    )
