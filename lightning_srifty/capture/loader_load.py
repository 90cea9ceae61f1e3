"""The training loader's worker processes: how much CPU they spend per batch.

A step on a faster GPU can wait for data that a slower GPU never waited for: the
workers make batches at their own pace, in parallel with training. The profile records
their CPU time over the window so the model can tell when the loader, not the GPU,
would set the step (:class:`~lightning_srifty.core.profile.DataLoading`).
"""

from __future__ import annotations

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


class LoaderMeter:
    """Measures the training loader's workers between the window's start and end."""

    def __init__(self) -> None:
        self._start: dict[int, float] | None = None

    def start(self, trainer: Any) -> None:
        pids = train_loader_worker_pids(trainer)
        self._start = cpu_seconds(pids) if pids else None

    def finish(self, trainer: Any, batches: int) -> DataLoading | None:
        """The workers' CPU per batch over the window, or ``None`` when the loader has no
        workers or its workers changed meanwhile (an epoch ended: a new set started,
        and the old set's last CPU time cannot be read any more)."""
        start, self._start = self._start, None
        if not start or batches < 1:
            return None
        pids = train_loader_worker_pids(trainer)
        if set(pids) != set(start):
            return None
        end = cpu_seconds(pids)
        if end is None:
            return None
        spent = sum(max(end[p] - start[p], 0.0) for p in pids)
        return DataLoading(workers=len(pids), cpu_s_per_batch=spent / batches, batches=batches)
