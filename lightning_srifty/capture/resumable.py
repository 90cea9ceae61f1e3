"""A map-style data loader that Lightning can resume mid-epoch, at the exact batch.

Lightning restores a loader's position only when the loader is *stateful* (it has
``state_dict``/``load_state_dict``; see ``FitLoop.on_save_checkpoint``). A plain
``torch.utils.data.DataLoader`` is not, so after a resume it starts the epoch again from
its first batch while the loop counters say otherwise: the model sees some samples twice
and others never, and a resumed run can no longer match an uninterrupted one.

:class:`ResumableLoader` shuffles with a generator seeded by ``(seed, epoch)``, so the
order of every epoch is a pure function of the epoch number, and records how many
samples the whole job has consumed in the current epoch. After a resume (possibly on a
different world size) it skips exactly those samples. It shards by rank itself, so it
is not a ``DataLoader`` and Lightning does not replace its sampler under DDP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

STATE_VERSION = 1


class _EpochSetter:
    """What Lightning calls ``set_epoch`` on (it looks for ``loader.sampler``)."""

    def __init__(self, loader: ResumableLoader) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


class ResumableLoader:
    """Batches of a map-style dataset in a seeded order, resumable at the exact batch.

    Args:
        dataset: Anything with ``__len__`` and ``__getitem__``.
        batch_size: Samples per batch on each rank.
        shuffle: Shuffle each epoch with a generator seeded by ``(seed, epoch)``.
        seed: Base seed; the same seed gives the same order on every run.
        drop_last: Drop the last incomplete batch (keeps every rank in step under DDP).
        collate_fn: Turns a list of samples into a batch.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        collate_fn: Callable[[list[Any]], Any] = default_collate,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.sampler = _EpochSetter(self)
        self._epoch = 0
        self._consumed_global = 0
        """Samples the whole job (all ranks) has taken from the current epoch."""
        self._resume_skip_global = 0

    # ---------------------------------------------------------------- topology
    @staticmethod
    def _rank_and_world() -> tuple[int, int]:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def _order(self, epoch: int) -> Sequence[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return range(n)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(n, generator=generator).tolist()

    def _batches_per_rank(self, world: int) -> int:
        per_rank = len(self.dataset) // world
        if self.drop_last:
            return per_rank // self.batch_size
        return -(-per_rank // self.batch_size)

    def __len__(self) -> int:
        return self._batches_per_rank(self._rank_and_world()[1])

    def set_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:
            # A checkpoint taken at the end of an epoch resumes in the next one.
            self._epoch = epoch
            self._consumed_global = 0
            self._resume_skip_global = 0

    def __iter__(self) -> Iterator[Any]:
        rank, world = self._rank_and_world()
        order = self._order(self._epoch)
        usable = (len(order) // world) * world
        mine = list(order[:usable])[rank::world]
        skip_batches = self._resume_skip_global // (self.batch_size * world)
        self._resume_skip_global = 0
        self._consumed_global = skip_batches * self.batch_size * world
        for first in range(skip_batches * self.batch_size, len(mine), self.batch_size):
            indices = mine[first : first + self.batch_size]
            if self.drop_last and len(indices) < self.batch_size:
                return
            self._consumed_global += len(indices) * world
            yield self.collate_fn([self.dataset[i] for i in indices])

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Where the job is in the current epoch, in samples across all ranks."""
        return {
            "state_version": STATE_VERSION,
            "epoch": self._epoch,
            "consumed_global": self._consumed_global,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("state_version") != STATE_VERSION:
            raise ValueError(
                f"ResumableLoader state_version {state.get('state_version')!r} is not "
                f"supported (expected {STATE_VERSION})"
            )
        self._epoch = int(state["epoch"])
        self._resume_skip_global = int(state["consumed_global"])
