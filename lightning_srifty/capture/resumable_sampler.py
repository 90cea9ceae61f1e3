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

Left alone: loaders that are not a plain ``torch.utils.data.DataLoader`` (they may be
stateful already, like torchdata's ``StatefulDataLoader`` or
:class:`~lightning_srifty.ResumableLoader`), and loaders with a sampler of the user's
own that has a ``generator``. Randomness inside the dataset drawn from the global
generator in the main process is not replayed for the one batch Lightning fetches
ahead before a resume restores the generators.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

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

    def state_dict(self, batches_done: int, world_size: int) -> dict[str, Any]:
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


def make_resumable(loader: Any) -> DataLoader | None:
    """A copy of a plain ``DataLoader`` whose batches come from a
    :class:`ResumingBatchSampler`; ``None`` when the loader is left as it is."""
    if type(loader) is not DataLoader or not isinstance(loader.batch_sampler, BatchSampler):
        return None
    sampler = loader.batch_sampler.sampler
    if isinstance(sampler, RandomSampler) and sampler.generator is not None:
        return None  # the user seeds it: its order already repeats
    kwargs: dict[str, Any] = {
        "batch_sampler": ResumingBatchSampler(loader.batch_sampler),
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
    return DataLoader(loader.dataset, **kwargs)
