"""The training loader's worker processes: how much CPU they spend per batch.

A step on a faster GPU can wait for data that a slower GPU never waited for: the
workers make batches at their own pace, in parallel with training. The profile records
their CPU time over the window so the model can tell when the loader, not the GPU,
would set the step (:class:`~lightning_srifty.core.profile.DataLoading`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psutil

from lightning_srifty.core.profile import DataLoading


def train_loader_worker_pids(trainer: Any) -> tuple[int, ...]:
    """Process ids of the workers of the training loaders' live iterators.

    Read from Lightning's fit loop (``fit_loop._combined_loader._iterator.iterators``:
    the iterators ``torch.utils.data.DataLoader.__iter__`` returned), which are private:
    anything unexpected gives no pids, and the profile then has no loader record.
    """
    combined = getattr(getattr(trainer, "fit_loop", None), "_combined_loader", None)
    iterators = getattr(getattr(combined, "_iterator", None), "iterators", None) or ()
    pids: list[int] = []
    for iterator in iterators:
        for worker in getattr(iterator, "_workers", None) or ():
            pid = getattr(worker, "pid", None)
            if isinstance(pid, int):
                pids.append(pid)
    return tuple(pids)


def cpu_seconds(pids: tuple[int, ...]) -> dict[int, float] | None:
    """User plus system CPU seconds of each process; ``None`` if any is gone or unreadable."""
    out = {}
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except (psutil.Error, OSError):
            return None
        out[pid] = float(times.user + times.system)
    return out


SEGMENT_BATCHES_PER_WORKER = 4
"""Batches a set of workers must be read apart, per worker, to count: twice what they
fetch ahead by default (``prefetch_factor=2`` each), so that the batches they made
between two readings are close to the batches trained."""


@dataclass
class _Segment:
    """One set of workers measured: its first reading and its latest."""

    start: dict[int, float]
    start_batch: int
    end: dict[int, float] | None = None
    end_batch: int = 0


class LoaderMeter:
    """Measures the training loader's workers over the profile's window.

    Workers read at the window's start and end. Without ``persistent_workers`` every
    epoch starts new ones and the old ones exit before the epoch's last batch is
    trained (Lightning fetches one batch ahead), so a window that crosses an epoch also
    reads the workers at the epoch's second-to-last batch, and again once the new set
    is seen: each set's CPU is counted between its own readings, against the batches
    trained between them. Two reads an epoch at most: the step is not slowed.
    """

    def __init__(self) -> None:
        self._open: _Segment | None = None
        self._closed: list[_Segment] = []
        self._batches = 0

    def start(self, trainer: Any) -> None:
        """Called at the window's first batch, before its :meth:`observe`, which reads
        the workers."""
        del trainer  # read by observe, once the set has started (see there)
        self._closed, self._batches = [], 0
        self._open = None

    def _segment(self, trainer: Any) -> _Segment | None:
        pids = train_loader_worker_pids(trainer)
        read = cpu_seconds(pids) if pids else None
        return _Segment(read, self._batches) if read else None

    def observe(self, trainer: Any, batch_idx: int) -> None:
        """Called at each batch's start inside the window.

        A new set of workers is first read only once each of them has delivered a
        batch (they take batches in turn: by the epoch's batch ``workers - 1``; Lightning
        fetches no batch ahead from a loader with a length): before that a worker may
        still be starting (a forkserver child unpickles the dataset, importing its
        modules), CPU that is not a batch's.
        """
        pids = set(train_loader_worker_pids(trainer))
        current = self._open
        if current is None or pids != set(current.start):
            if current is not None and current.end is not None:
                self._closed.append(current)
            started = bool(pids) and batch_idx >= len(pids) - 1
            self._open = self._segment(trainer) if started else None
        else:
            last = getattr(trainer, "num_training_batches", None)
            if isinstance(last, int) and batch_idx == last - 2:
                end = cpu_seconds(tuple(current.start))
                if end is not None:
                    current.end, current.end_batch = end, self._batches
        self._batches += 1

    def finish(self, trainer: Any) -> DataLoading | None:
        """The workers' CPU per batch trained over the window; ``None`` when the loader
        has no workers or no set of them could be read far enough apart (epochs shorter
        than :data:`SEGMENT_BATCHES_PER_WORKER` batches a worker)."""
        current, self._open = self._open, None
        if current is not None:
            pids = train_loader_worker_pids(trainer)
            end = cpu_seconds(pids) if set(pids) == set(current.start) else None
            if end is not None:
                current.end, current.end_batch = end, self._batches
            if current.end is not None:
                self._closed.append(current)
        counted = [
            seg
            for seg in self._closed
            if seg.end_batch - seg.start_batch >= SEGMENT_BATCHES_PER_WORKER * len(seg.start)
        ]  # closer readings are within the prefetch's reach: they say little
        batches = sum(seg.end_batch - seg.start_batch for seg in counted)
        if batches < 1:
            return None
        spent = sum(
            max(seg.end[p] - seg.start[p], 0.0) for seg in counted if seg.end for p in seg.start
        )
        return DataLoading(
            workers=max(len(seg.start) for seg in counted),
            cpu_s_per_batch=spent / batches,
            batches=batches,
        )
