"""SIGTERM and SIGHUP end ``srifty-launch`` the way Ctrl-C does: through its teardown.

A closed SSH session (SIGHUP), ``kill`` or a service manager (SIGTERM) would otherwise
end the process where it stands and leave the run's clusters billing. Inside
:func:`terminating` both signals raise :class:`Terminated`, a ``KeyboardInterrupt``, so
every path that already answers Ctrl-C (the controller's attempt, a launch in flight,
the launcher's teardown of what the run started) answers them too, including
``--keep-clusters``. Signals that arrive while that teardown runs are logged and
ignored: a second ``kill`` must not leave half of it undone (SIGKILL still ends it; the
clusters' autostop then takes them down).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

HANDLED = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """The launcher was asked to stop by a signal (handled like Ctrl-C)."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"terminated by {self.name}")

    @property
    def exit_code(self) -> int:
        """What a shell reports for a process ended by this signal (128 + number)."""
        return 128 + self.signum


@contextmanager
def terminating() -> Iterator[None]:
    """Turns SIGTERM and SIGHUP into :class:`Terminated` while the block runs.

    Only the main thread can install handlers; elsewhere (a test runner's worker
    thread) the block runs with the signals as they were.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        del frame
        if received:
            log.warning(
                "%s while taking down what the run started: ignored (the teardown finishes first)",
                signal.Signals(signum).name,
            )
            return
        received.append(signum)
        raise Terminated(signum)

    previous: dict[signal.Signals, Any] = {}
    for handled in HANDLED:
        previous[handled] = signal.signal(handled, handler)
    try:
        yield
    finally:
        for handled, old in previous.items():
            signal.signal(handled, old)
