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
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl

from lightning_srifty.capture.environment import IMDS_ENDPOINT, imds_enabled
from lightning_srifty.core import launch_protocol as proto

log = logging.getLogger(__name__)

SPOT_NOTICE_PATH = "/latest/meta-data/spot/instance-action"
SPOT_POLL_S = 5.0
"""AWS recommends polling the notice every 5 seconds."""
IMDS_TIMEOUT_S = 0.5
TOKEN_TTL_S = 21600


@dataclass(frozen=True)
class SpotNotice:
    """An EC2 spot interruption notice (``{"action": "terminate", "time": "..."}``)."""

    action: str
    time: str


def fetch_spot_notice(
    endpoint: str = IMDS_ENDPOINT, token: str | None = None, timeout_s: float = IMDS_TIMEOUT_S
) -> tuple[SpotNotice | None, str | None]:
    """One IMDSv2 look-up of the spot notice.

    Returns:
        ``(notice or None, token)``; the token is ``None`` when the metadata service is
        unreachable (not on EC2), which tells the poller to stop.
    """
    try:
        if token is None:
            request = urllib.request.Request(
                f"{endpoint}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310
                token = resp.read().decode()
        request = urllib.request.Request(
            f"{endpoint}{SPOT_NOTICE_PATH}", headers={"X-aws-ec2-metadata-token": token}
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310
            body: Any = json.loads(resp.read().decode() or "{}")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # no notice: the normal case on a healthy spot VM
            return None, token
        if exc.code == 401:  # token expired; fetch a new one next time
            return None, ""
        return None, token
    except (OSError, ValueError):
        return None, token if token else None
    if not isinstance(body, dict):
        return None, token
    return SpotNotice(str(body.get("action", "terminate")), str(body.get("time", ""))), token


class PreemptionWatcher:
    """Raises a flag on SIGTERM or an EC2 spot notice.

    Args:
        env: Environment (``SRIFTY_IMDS=off`` disables the metadata service).
        endpoint: The metadata service (tests point it at a local server).
        poll_s: Seconds between spot-notice look-ups.
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        endpoint: str = IMDS_ENDPOINT,
        poll_s: float = SPOT_POLL_S,
    ):
        self.env = os.environ if env is None else env
        self.endpoint = endpoint
        self.poll_s = poll_s
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
        if imds_enabled(self.env) and self._thread is None:
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
        token: str | None = ""
        while not self._stop.is_set():
            notice, token = fetch_spot_notice(self.endpoint, token or None)
            if token is None:
                log.debug("no EC2 metadata service; not polling for spot notices")
                return
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
