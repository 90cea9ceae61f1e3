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

Several training loaders (a dict or list, which Lightning combines in ``max_size_cycle``
mode) each advance one batch per training batch, and a shorter one starts a new pass over
its data, with a new order drawn from the global generator, whenever it runs out. The
sampler keeps the passes of the epoch (seed, first batch, batches yielded), so the
position it saves is the pass the run stood in and the batch inside it; the resumed run
starts there and its later passes draw their orders as the uninterrupted run did. A
stream counts only its epoch's batches: one that Lightning cycles because it is shorter
than another loader resumes at the start of a pass, not at its batch.

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
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

STATE_VERSION = 1


@dataclass
class _Pass:
    """One pass of a batch sampler over its data within a training epoch."""

    before: int
    """Training batches of the epoch done before this pass's first yielded batch."""
    start: int
    """Index in the pass of its first yielded batch (the batches a resume skipped)."""
    seed: int | None
    yielded: int = 0


class ResumingBatchSampler:
    """Batches of an inner batch sampler; remembers the shuffle seed, resumes by skipping.

    Args:
        inner: The loader's own batch sampler (a ``BatchSampler`` over its sampler).
        current_epoch: The Trainer's epoch. Lightning calls ``set_epoch`` on the inner
            sampler, never on a batch sampler, so without it the epoch is the one
            ``set_epoch`` or a resume last set.
    """

    def __init__(self, inner: Any, current_epoch: Callable[[], int] | None = None) -> None:
        self.inner = inner
        self._current_epoch = current_epoch
        self.sampler = getattr(inner, "sampler", None)
        """Where Lightning looks for ``set_epoch`` (a ``DistributedSampler`` under DDP)."""
        self.batch_size = getattr(inner, "batch_size", None)
        self.drop_last = getattr(inner, "drop_last", False)
        self.epoch = 0
        self.seed: int | None = None
        """The seed of this pass's order (a ``RandomSampler`` without its own generator)."""
        self._pending: dict[str, Any] | None = None
        self._passes: list[_Pass] = []
        self._passes_epoch: int | None = None

    def __len__(self) -> int:
        return len(self.inner)

    def _epoch(self) -> int:
        return int(self._current_epoch()) if self._current_epoch is not None else self.epoch

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

    def position(
        self, batches_done: int, world_size: int, *, epoch_closed: bool = False
    ) -> dict[str, Any]:
        """Where the epoch stands, for the checkpoint (not ``state_dict``: Lightning would
        take a loader part with that name for a stateful loader of its own).
        ``epoch_closed``: the batches done end the epoch; a resume starts the next afresh
        (Lightning may count that epoch already, or not yet)."""
        done = int(batches_done)
        epoch = self._epoch()
        seed, batches, before = self.seed, done, 0
        if self._passes_epoch == epoch and self._passes:
            # the pass that holds the next batch: one already begun at it (its order
            # drawn) holds it at its first batch
            holder = next((p for p in reversed(self._passes) if p.before <= done), None)
            if holder is not None:
                seed, batches = holder.seed, holder.start + done - holder.before
                before = holder.before - holder.start  # done before the pass began
        return {
            "state_version": STATE_VERSION,
            "epoch": epoch,
            "seed": seed,
            "batches": batches,
            "world_size": int(world_size),
            "closed": bool(epoch_closed),
            "before": before,
            # ``before``: training batches of the epoch before this pass (a shorter
            # loader's earlier passes); ``batches``: where the pass stands
        }

    def __iter__(self) -> Iterator[Any]:
        pending, self._pending = self._pending, None
        epoch = self._epoch()
        if pending is not None and (
            pending.get("closed") or int(pending.get("epoch", -1)) != epoch
        ):
            pending = None  # the checkpoint closed its epoch: this one starts afresh
        if self._passes_epoch != epoch:
            self._passes_epoch, self._passes = epoch, []
        before = self._passes[-1].before + self._passes[-1].yielded if self._passes else 0
        skip = 0
        shuffled = isinstance(self.sampler, RandomSampler) and self.sampler.generator is None
        if pending is not None:
            scale = int(pending.get("world_size", 1)) / pending["resumed_world"]
            skip = math.ceil(int(pending.get("batches", 0)) * scale)
            before = math.ceil(int(pending.get("before", 0)) * scale)
            if skip >= len(self.inner) and self._current_epoch is not None:
                # Saved after the pass's last batch in an epoch that goes on (a shorter
                # loader Lightning cycles): end this pass at once, so that Lightning
                # starts the next as the uninterrupted run did (a new iterator, which
                # draws its base seed, then this sampler's order).
                self._passes.append(_Pass(before=before + skip, start=skip, seed=self.seed))
                return
            if skip >= len(self.inner):
                # Saved after the epoch's last batch (no Trainer epoch to tell): the next
                # epoch starts afresh, not a whole pass's worth of batches skipped.
                pending, before, skip = None, before + skip, 0
        if pending is not None:
            self.seed = pending.get("seed")
        elif shuffled:
            # exactly what RandomSampler.__iter__ draws when it has no generator
            self.seed = int(torch.empty((), dtype=torch.int64).random_().item())
        this_pass = _Pass(before=before + skip, start=skip, seed=self.seed)
        self._passes.append(this_pass)
        if shuffled and self.seed is not None:
            assert isinstance(self.sampler, RandomSampler)
            self.sampler.generator = torch.Generator().manual_seed(self.seed)
        try:
            for index, batch in enumerate(self.inner):
                if index >= skip:
                    this_pass.yielded += 1
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

    def position(
        self, batches_done: int, world_size: int, *, epoch_closed: bool = False
    ) -> dict[str, Any]:
        """Where the epoch stands, for the checkpoint."""
        return {
            "state_version": STATE_VERSION,
            "stream": True,
            "epoch": int(self._current_epoch()),
            "batches": int(batches_done),
            "world_size": int(world_size),
            "closed": bool(epoch_closed),
        }

    def __iter__(self) -> Any:
        iterator = super().__iter__()
        pending, self._pending = self._pending, None
        if (
            pending is None
            or pending.get("closed")
            or int(pending.get("epoch", -1)) != int(self._current_epoch())
        ):
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
        batch_sampler=ResumingBatchSampler(loader.batch_sampler, current_epoch),
        **_loader_kwargs(loader),
    )
