"""DataLoader workers that outlive a preemption notice until the trainer has saved.

A spot reclaim, SkyPilot's cancel and the local backend all send SIGTERM to every
process of the job, DataLoader workers included. PyTorch's worker loop installs its own
SIGTERM handler (``torch/csrc/DataLoader.cpp``: a SIGTERM from anyone but the parent
re-raises with the default action), so the workers die at once; the trainer's SIGCHLD
handler then raises "DataLoader worker ... is killed by signal: Terminated" in the middle
of whatever it does, and the emergency checkpoint never happens. Under the launcher the
workers therefore ignore SIGTERM: the trainer decides (all ranks agree on a step, save,
exit), and the workers end with it, as they always do when their parent goes away
(PyTorch's worker watchdog), or at the SIGKILL that ends a grace period.

Workers get the disposition from their ``worker_init_fn``, which PyTorch calls after its
own handlers are installed; :func:`keep_workers_through_sigterm` wraps whatever
``worker_init_fn`` a loader has (Lightning's seeding one included) when its workers
start, for every ``DataLoader`` of the process, however and whenever it was built. The
wrapper is a ``functools.partial`` of a module-level function, so it pickles for the
``spawn`` and ``forkserver`` start methods too.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
from typing import Any


def ignore_sigterm_then(init_fn: Callable[[int], None] | None, worker_id: int) -> None:
    """A worker's first act: ignore SIGTERM; then the loader's own ``worker_init_fn``."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if init_fn is not None:
        init_fn(worker_id)


def keep_workers_through_sigterm() -> Callable[[], None]:
    """Makes DataLoader workers started from now on ignore SIGTERM; returns the undo."""
    from torch.utils.data import dataloader

    iterator = dataloader._MultiProcessingDataLoaderIter
    original = iterator.__init__

    @functools.wraps(original)
    def start_workers(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        init_fn = loader.worker_init_fn
        already = isinstance(init_fn, functools.partial) and init_fn.func is ignore_sigterm_then
        if already:
            original(self, loader, *args, **kwargs)
            return
        loader.worker_init_fn = functools.partial(ignore_sigterm_then, init_fn)
        try:
            original(self, loader, *args, **kwargs)
        finally:
            loader.worker_init_fn = init_fn

    iterator.__init__ = start_workers  # type: ignore[method-assign]

    def undo() -> None:
        iterator.__init__ = original  # type: ignore[method-assign]

    return undo
