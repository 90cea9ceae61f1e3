"""DataLoader workers that outlive a preemption notice until the trainer has saved.

A spot reclaim, SkyPilot's cancel and the local backend all send SIGTERM to every
process of the job, DataLoader workers included: SkyPilot runs the job's command in its
own session (``sky/skylet/log_lib.py``: ``run_with_log``, ``start_new_session=True``)
watched by ``sky/skylet/subprocess_daemon.py``, whose ``kill_process_tree`` terminates
the command and every descendant it found (refreshed each second) and SIGKILLs them 30 s
later (``kill_process_group`` does the same to the whole group); a cancel starts that
with ``os.killpg(job_pgid, SIGTERM)`` on the job driver (``sky/skylet/job_lib.py``:
``cancel_jobs``), and a reclaimed VM's shutdown signals every process. Signalling only
the trainer processes is therefore not an option: the workers must survive the signal.

PyTorch's worker loop installs its own SIGTERM handler
(``torch.utils.data._utils.worker._worker_loop`` → ``_set_worker_signal_handlers``,
``torch/csrc/DataLoader.cpp``: a SIGTERM from anyone but the parent re-raises with the
default action), so a signalled worker dies at once; the trainer's SIGCHLD handler then
raises "DataLoader worker ... is killed by signal: Terminated" in the middle of whatever
it does, and the emergency checkpoint never happens. Under the launcher the workers
therefore ignore SIGTERM: the trainer decides (all ranks agree on a step, save, exit),
and the workers end with it, as they always do when their parent goes away (PyTorch's
worker watchdog), or at the SIGKILL that ends a grace period.

A worker can only set that disposition from its ``worker_init_fn``, which PyTorch calls
after its own handlers are installed and after seeding and imports: a SIGTERM landing
in between (a worker started at an epoch boundary as the notice arrives) would kill it.
So the trainer blocks SIGTERM (``pthread_sigmask``) while it creates the workers: a
child inherits the blocked mask across ``fork`` and across ``exec`` (the ``spawn`` start
method, and the ``forkserver`` server, which is started on first use from inside this
window, after the resource tracker, which would unblock it), so a SIGTERM sent to a
new worker stays pending until its ``worker_init_fn``
sets ``SIG_IGN``, which discards it (POSIX), and only then unblocks. The trainer's own
mask is restored as soon as the iterator exists, and a SIGTERM that reached it meanwhile
is delivered then. A forkserver that something else started before the fit is outside
this window: its workers keep the old race, and the server itself dies on SIGTERM.

:func:`keep_workers_through_sigterm` does both for every ``DataLoader`` of the process,
however and whenever it was built, wrapping whatever ``worker_init_fn`` a loader has
(Lightning's seeding one included). The wrapper is a ``functools.partial`` of a
module-level function, so it pickles for the ``spawn`` and ``forkserver`` start methods.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import weakref
from collections.abc import Callable
from typing import Any

_CAN_MASK = hasattr(signal, "pthread_sigmask")
"""POSIX: the mask exists (not on Windows, which has neither fork nor SIGTERM senders)."""

_STARTED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Iterators whose workers were started here and may still run (for :func:`stop_workers`)."""


def ignore_sigterm_then(
    init_fn: Callable[[int], None] | None, worker_id: int, *, unblock: bool = False
) -> None:
    """A worker's first act: ignore SIGTERM (dropping one pending since it started),
    unblock it if the trainer blocked it only to start this worker, then run the
    loader's own ``worker_init_fn``."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if unblock and _CAN_MASK:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if init_fn is not None:
        init_fn(worker_id)


def _block_sigterm() -> set[int] | None:
    """Blocks SIGTERM in this thread; returns the mask to restore (``None``: no masks)."""
    if not _CAN_MASK:
        return None
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}))


def _restore_mask(previous: set[int] | None) -> None:
    """Puts the mask back; a SIGTERM that arrived meanwhile is delivered now."""
    if previous is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _start_resource_tracker_first(loader: Any) -> None:
    """Starts multiprocessing's resource tracker now, outside the blocked window.

    The ``spawn`` and ``forkserver`` start methods register their semaphores with the
    resource tracker, started on first use; starting it unblocks SIGTERM in the calling
    thread (``multiprocessing/resource_tracker.py``: ``ensure_running`` blocks SIGINT and
    SIGTERM around the spawn, then *unblocks* them), which would reopen the window for
    the workers started after it, and for a fork server started after it, for good.
    """
    context = loader.multiprocessing_context
    if context is None:
        import multiprocessing

        method = multiprocessing.get_start_method(allow_none=False)
    else:
        method = context.get_start_method()
    if method != "fork":
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()


def keep_workers_through_sigterm() -> Callable[[], None]:
    """Makes DataLoader workers started from now on ignore SIGTERM, with no window in
    which a new worker can be killed by one; returns the undo."""
    from torch.utils.data import dataloader

    iterator = dataloader._MultiProcessingDataLoaderIter
    original = iterator.__init__

    @functools.wraps(original)
    def start_workers(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        init_fn = loader.worker_init_fn
        already = isinstance(init_fn, functools.partial) and init_fn.func is ignore_sigterm_then
        # Workers are created in here (persistent ones too, once): block first.
        _start_resource_tracker_first(loader)
        previous = _block_sigterm()
        try:
            if already:
                original(self, loader, *args, **kwargs)
                return
            # A worker unblocks only what this thread did not block already.
            unblock = previous is not None and signal.SIGTERM not in previous
            loader.worker_init_fn = functools.partial(ignore_sigterm_then, init_fn, unblock=unblock)
            try:
                original(self, loader, *args, **kwargs)
            finally:
                loader.worker_init_fn = init_fn
            _STARTED.add(self)
        finally:
            _restore_mask(previous)

    iterator.__init__ = start_workers  # type: ignore[method-assign]

    def undo() -> None:
        iterator.__init__ = original  # type: ignore[method-assign]

    return undo


def stop_workers() -> None:
    """Ends the workers of every iterator still running, as the iterator's own end would.

    The emergency exit leaves with ``os._exit``, which skips that clean-up. Forked
    workers would then wait up to PyTorch's watchdog interval (5 s) to see their parent
    gone, and ``forkserver`` workers would never see it: their parent is the fork
    server, which keeps SIGTERM blocked (it was started in the blocked window) and only
    ends when its liveness pipe closes, a pipe each worker holds a copy of. A worker
    that does not stop when told is killed (it ignores SIGTERM).
    """
    for iterator in list(_STARTED):
        with contextlib.suppress(Exception):
            iterator._shutdown_workers()
        for worker in getattr(iterator, "_workers", ()):
            with contextlib.suppress(Exception):
                if worker.is_alive():
                    worker.kill()
                    worker.join(timeout=1.0)
    _STARTED.clear()
