"""Preemption notices inside the job: SIGTERM and the EC2 spot interruption notice.

A spot VM gets two minutes' warning. Two signals carry it here:

* **SIGTERM**, which SkyPilot, torchrun, Kubernetes and our local backend send before
  killing a process;
* the **EC2 spot instance-action notice**, which appears at
  ``/latest/meta-data/spot/instance-action`` in the instance metadata service (IMDSv2)
  about two minutes before AWS reclaims the instance, often before any SIGTERM.

:class:`PreemptionWatcher` turns either into a flag that the callback reads at the next
step boundary (a signal handler only sets the flag: checkpointing from inside a handler
could interrupt a collective half-way). Ranks then agree (one boolean all-reduce) so
that every rank saves the same emergency checkpoint, and the job exits with
:data:`~lightning_srifty.core.launch_protocol.PREEMPTED_EXIT_CODE`.

The watcher replaces Lightning's own SIGTERM handler while training runs: Lightning's
handler broadcasts from inside the signal handler and then aborts the fit loop with
``SIGTERMException``, before anything could be saved. The previous handler is restored
on :meth:`PreemptionWatcher.close`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl

from lightning_srifty.capture.imds import (
    DMI_DIR,
    HYPERVISOR_UUID,
    IMDS_ENDPOINT,
    ImdsClient,
    imds_allowed,
)
from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.errors import MetadataUnavailableError

log = logging.getLogger(__name__)

SPOT_NOTICE_PATH = "spot/instance-action"
SPOT_POLL_S = 5.0
"""AWS recommends polling the notice every 5 seconds."""
IMDS_TIMEOUT_S = 1.0
POLL_BACKOFF_MAX_S = 60.0
"""Longest wait between polls while the metadata service does not answer."""


@dataclass(frozen=True)
class SpotNotice:
    """An EC2 spot interruption notice (``{"action": "terminate", "time": "..."}``)."""

    action: str
    time: str


def fetch_spot_notice(client: ImdsClient) -> SpotNotice | None:
    """One IMDSv2 look-up of the spot notice: ``None`` (404) on a healthy spot VM.

    Raises:
        MetadataUnavailableError: the service did not answer after the client's retries.
    """
    text = client.get(SPOT_NOTICE_PATH)
    if text is None:
        return None
    try:
        body: Any = json.loads(text or "{}")
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    return SpotNotice(str(body.get("action", "terminate")), str(body.get("time", "")))


class PreemptionWatcher:
    """Raises a flag on SIGTERM or an EC2 spot notice.

    The notice is polled only on EC2 (see :func:`~lightning_srifty.capture.imds.imds_allowed`).
    A metadata service that stops answering is retried with a growing wait (up to
    :data:`POLL_BACKOFF_MAX_S`), never given up on: one slow answer must not switch off
    the two-minute warning for the rest of the run.

    Args:
        env: Environment (``SRIFTY_IMDS``: ``auto``, ``on`` or ``off``).
        endpoint: The metadata service (tests point it at a local server).
        poll_s: Seconds between spot-notice look-ups.
        client: A prepared metadata client (tests shorten its timeouts and token TTL).
        dmi_dir: Where the DMI vendor files are (tests pass their own).
        hypervisor_uuid: Xen's ``/sys/hypervisor/uuid`` (older EC2 instances).
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        endpoint: str = IMDS_ENDPOINT,
        poll_s: float = SPOT_POLL_S,
        client: ImdsClient | None = None,
        dmi_dir: Path = DMI_DIR,
        hypervisor_uuid: Path = HYPERVISOR_UUID,
    ):
        self.env = os.environ if env is None else env
        self.endpoint = endpoint
        self.poll_s = poll_s
        self.client = client
        self.dmi_dir = dmi_dir
        self.hypervisor_uuid = hypervisor_uuid
        self.failed_polls = 0
        """Look-ups that got no answer (each already retried by the client)."""
        self.reason = ""
        self.noticed_at: float | None = None
        self._flag = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_handler: Any = None
        self._installed = False

    def start(self) -> None:
        """Installs the SIGTERM handler (main thread only) and starts the poller."""
        if threading.current_thread() is threading.main_thread() and not self._installed:
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        allowed = imds_allowed(self.env, dmi_dir=self.dmi_dir, hypervisor_uuid=self.hypervisor_uuid)
        if allowed and self._thread is None:
            self._thread = threading.Thread(
                target=self._poll, name="srifty-spot-notice", daemon=True
            )
            self._thread.start()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._raise("SIGTERM")

    def _raise(self, reason: str) -> None:
        if not self._flag.is_set():
            self.reason = reason
            self.noticed_at = time.monotonic()
            self._flag.set()

    def _poll(self) -> None:
        client = self.client or ImdsClient(self.endpoint, timeout_s=IMDS_TIMEOUT_S)
        misses = 0
        while not self._stop.is_set():
            try:
                notice = fetch_spot_notice(client)
            except MetadataUnavailableError as exc:
                misses += 1
                self.failed_polls += 1
                wait = min(self.poll_s * 2 ** min(misses, 6), POLL_BACKOFF_MAX_S)
                if misses == 1 or misses % 10 == 0:
                    log.warning("spot notice look-up failed (%s); retrying in %.0f s", exc, wait)
                self._stop.wait(wait)
                continue
            misses = 0
            if notice is not None:
                log.warning("EC2 spot interruption notice: %s at %s", notice.action, notice.time)
                self._raise(f"EC2 spot notice ({notice.action} at {notice.time})")
                return
            self._stop.wait(self.poll_s)

    def should_checkpoint(self) -> bool:
        return self._flag.is_set()

    def close(self) -> None:
        """Stops polling and gives SIGTERM back to whoever had it."""
        self._stop.set()
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_handler or signal.SIG_DFL)
            self._installed = False


def agree_across_ranks(trainer: pl.Trainer, noticed: bool) -> bool:
    """True on every rank when any rank saw a notice (a one-boolean all-reduce)."""
    return bool(trainer.strategy.reduce_boolean_decision(noticed, all=False))


def finish_preempted(state_dir: Path | None) -> int:
    """Leaves the preempted marker for the launcher; returns the exit code to use."""
    if state_dir is not None:
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            (state_dir / proto.PREEMPTED_MARKER).touch()
        except OSError as exc:
            log.warning("cannot write the preemption marker in %s: %s", state_dir, exc)
    return proto.PREEMPTED_EXIT_CODE
