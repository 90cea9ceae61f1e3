"""Preemption notices inside the job: SIGTERM and the EC2 spot interruption notice.

A spot VM gets two minutes' warning. Two signals carry it here:

* **SIGTERM**, which SkyPilot, torchrun, Kubernetes and our local backend send before
  killing a process;
* the **EC2 spot instance-action notice**, which appears at
  ``/latest/meta-data/spot/instance-action`` in the instance metadata service (IMDSv2)
  about two minutes before AWS reclaims the instance, often before any SIGTERM.

:class:`PreemptionWatcher` turns either into a flag that the callback reads at the next
step boundary (a signal handler only sets the flag: checkpointing from inside a handler
could interrupt a collective half-way). Ranks then agree (:class:`StepVote`) so that
every rank saves the same emergency checkpoint at the same step, and the job exits with
:data:`~lightning_srifty.core.launch_protocol.PREEMPTED_EXIT_CODE`. The same vote
carries rank zero's "a periodic checkpoint is due" (a clock reading that ranks would
otherwise each judge on their own, and saving is collective: ranks that disagree hang).

The watcher replaces Lightning's own SIGTERM handler while training runs: Lightning's
handler broadcasts from inside the signal handler and then aborts the fit loop with
``SIGTERMException``, before anything could be saved. The previous handler is restored
on :meth:`PreemptionWatcher.close`.
"""

from __future__ import annotations

import json
import logging
import math
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
    ImdsClient,
    imds_allowed,
    imds_endpoint,
)
from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.errors import MetadataTokenError, MetadataUnavailableError

log = logging.getLogger(__name__)

SPOT_NOTICE_PATH = "spot/instance-action"
SPOT_POLL_S = 5.0
"""AWS recommends polling the notice every 5 seconds."""
IMDS_TIMEOUT_S = 1.0
POLL_BACKOFF_MAX_S = 60.0
"""Longest wait between polls while the metadata service does not answer."""
HOP_LIMIT_HINT = (
    "in a Docker container the IMDSv2 token reply is dropped when the instance's "
    "metadata hop limit is 1: set it to 2 (aws ec2 modify-instance-metadata-options "
    "--http-put-response-hop-limit 2) or run the container with host networking"
)


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
    the two-minute warning for the rest of the run. It says so once, as one warning
    (with the Docker hop-limit hint when no IMDSv2 token comes back), and once more
    when the service answers again; SIGTERM is handled throughout.

    Args:
        env: Environment (``SRIFTY_IMDS``: ``auto``, ``on`` or ``off``).
        endpoint: The metadata service; by default ``AWS_EC2_METADATA_SERVICE_ENDPOINT``
            from ``env`` (as the AWS SDKs read it), else 169.254.169.254.
        poll_s: Seconds between spot-notice look-ups.
        client: A prepared metadata client (tests shorten its timeouts and token TTL).
        dmi_dir: Where the DMI vendor files are (tests pass their own).
        hypervisor_uuid: Xen's ``/sys/hypervisor/uuid`` (older EC2 instances).
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        endpoint: str | None = None,
        poll_s: float = SPOT_POLL_S,
        client: ImdsClient | None = None,
        dmi_dir: Path = DMI_DIR,
        hypervisor_uuid: Path = HYPERVISOR_UUID,
    ):
        self.env = os.environ if env is None else env
        self.endpoint = endpoint or imds_endpoint(self.env)
        self.poll_s = poll_s
        self.client = client
        self.dmi_dir = dmi_dir
        self.hypervisor_uuid = hypervisor_uuid
        self.failed_polls = 0
        """Look-ups that got no answer (each already retried by the client)."""
        self.degraded = ""
        """Why the spot notice is out of reach, while it is (empty otherwise)."""
        self.reason = ""
        self.noticed_at: float | None = None
        self._noticed = False
        """Set once by :meth:`_raise`: a plain attribute, never a lock (see there)."""
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

    def notice(self, reason: str) -> None:
        """Raises the flag for a notice that reached the job some other way."""
        self._raise(reason)

    def _raise(self, reason: str) -> None:
        """Records the first notice. Runs inside the SIGTERM handler, so it takes no lock.

        Python runs a handler between two bytecodes of the main thread, and a second
        SIGTERM can land inside the first handler: a local rank gets one from the
        launcher and one from torchrun's ``killpg`` at once. With a ``threading.Event``
        the first handler held the event's lock inside ``set()`` when the second
        handler asked for it again, and the rank hung for good, saving nothing (seen
        in a node log's stack dump: ``_on_sigterm`` > ``Event.set`` > ``__enter__``
        twice on one thread, the job killed after its grace).
        """
        if not self._noticed:
            self.reason = reason
            self.noticed_at = time.monotonic()
            self._noticed = True

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
                if not self.degraded:
                    hint = f"; {HOP_LIMIT_HINT}" if isinstance(exc, MetadataTokenError) else ""
                    self.degraded = str(exc)
                    log.warning(
                        "EC2 spot notice unavailable (%s): the job still saves on SIGTERM, and "
                        "keeps asking every %.0f s at most%s",
                        exc,
                        POLL_BACKOFF_MAX_S,
                        hint,
                    )
                else:
                    log.debug("spot notice look-up failed again (%s); next in %.0f s", exc, wait)
                self._stop.wait(wait)
                continue
            if self.degraded:
                log.warning("EC2 spot notice reachable again after %d failed look-ups", misses)
                self.degraded = ""
            misses = 0
            if notice is not None:
                log.warning("EC2 spot interruption notice: %s at %s", notice.action, notice.time)
                self._raise(f"EC2 spot notice ({notice.action} at {notice.time})")
                return
            self._stop.wait(self.poll_s)

    def should_checkpoint(self) -> bool:
        return self._noticed

    def close(self) -> None:
        """Stops polling and gives SIGTERM back to whoever had it."""
        self._stop.set()
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_handler or signal.SIG_DFL)
            self._installed = False


def agree_across_ranks(trainer: pl.Trainer, noticed: bool) -> bool:
    """True on every rank when any rank saw a notice (a blocking one-boolean all-reduce).

    Kept as the reference the overhead benchmark compares :class:`StepVote` with.
    """
    return bool(trainer.strategy.reduce_boolean_decision(noticed, all=False))


@dataclass(frozen=True)
class VoteResult:
    """What every rank agreed on at this step boundary."""

    preempt: bool = False
    """Some rank saw a preemption notice: save an emergency checkpoint and exit."""
    checkpoint: bool = False
    """Rank zero found a time-based periodic checkpoint due: save one now."""


NO_DECISION = VoteResult()
VOTE_PERIOD_S = 1.0
"""Aim: one vote a second, whatever the step time (a two-minute notice has room)."""
MAX_VOTE_EVERY = 10_000


class StepVote:
    """A rank-agreed decision at step boundaries that costs next to nothing per step.

    Every ``k`` steps each rank starts a *non-blocking* all-reduce of three numbers on a
    private gloo group (CPU tensors: the GPU stream is never touched or synchronised):
    its own notice flag, rank zero's "periodic checkpoint due" flag, and rank zero's
    choice of ``k`` for the next round. ``k`` steps later every rank collects the sum,
    which arrived long ago, so ``wait()`` returns at once. Because all ranks count the
    same steps, they collect, and act, at the same step: an emergency checkpoint or a
    periodic one is decided once, for all of them.

    Rank zero picks ``k`` from its step time so that a round lasts about
    :data:`VOTE_PERIOD_S`; a notice therefore reaches every rank within about two
    periods. Without torch.distributed (one process) the flags are used as they are.
    :attr:`spent_s` and :attr:`steps` let the benchmark report the cost per step.
    """

    def __init__(self, *, period_s: float = VOTE_PERIOD_S, max_every: int = MAX_VOTE_EVERY):
        self.period_s = period_s
        self.max_every = max(int(max_every), 1)
        self.every = 1
        self.steps = 0
        self.rounds = 0
        self.collect_s = 0.0
        """Training-thread seconds spent collecting results (mostly ``wait()``)."""
        self.launch_s = 0.0
        """Training-thread seconds spent starting rounds."""
        self._group: Any = None
        self._rank = 0
        self._work: Any = None
        self._buffer: Any = None
        self._collect_at = 0
        self._last_step_at: float | None = None
        self._step_s: float | None = None

    @property
    def distributed(self) -> bool:
        return self._group is not None

    @property
    def spent_s(self) -> float:
        """Training-thread seconds the vote cost so far."""
        return self.collect_s + self.launch_s

    def start(self) -> None:
        """Creates the private gloo group; a collective, so every rank must call it."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self._rank = dist.get_rank()
            self._group = dist.new_group(backend="gloo")

    def collect(self) -> VoteResult:
        """At a step boundary: the agreed result if a round ends here, else no decision."""
        began = time.perf_counter()
        self.steps += 1
        if self._rank == 0:
            if self._last_step_at is not None:
                dt = began - self._last_step_at
                self._step_s = dt if self._step_s is None else 0.8 * self._step_s + 0.2 * dt
            self._last_step_at = began
        result = NO_DECISION
        if self._work is not None and self.steps >= self._collect_at:
            self._work.wait()
            preempt, due, every = (float(v) for v in self._buffer.tolist())
            self._work = None
            self.rounds += 1
            result = VoteResult(preempt > 0, due > 0)
            if every >= 1:
                self.every = min(int(every), self.max_every)
        self.collect_s += time.perf_counter() - began
        return result

    def launch(self, notice: bool, checkpoint_due: bool) -> VoteResult:
        """After acting on :meth:`collect`: starts the next round if none is running.

        Returns the decision to apply *now* when there is nothing to agree with (one
        process); with several ranks the answer comes from a later :meth:`collect`.
        """
        if self._group is None:
            return VoteResult(notice, checkpoint_due)
        if self._work is not None:
            return NO_DECISION
        import torch
        import torch.distributed as dist

        began = time.perf_counter()
        proposal = 0.0
        if self._rank == 0 and self._step_s:
            proposal = float(min(max(math.ceil(self.period_s / self._step_s), 1), self.max_every))
        mine = [
            1.0 if notice else 0.0,
            1.0 if (checkpoint_due and self._rank == 0) else 0.0,
            proposal if self._rank == 0 else 0.0,
        ]
        self._buffer = torch.tensor(mine, dtype=torch.float64)
        self._work = dist.all_reduce(self._buffer, group=self._group, async_op=True)
        self._collect_at = self.steps + self.every
        self.launch_s += time.perf_counter() - began
        return NO_DECISION

    def finish(self) -> None:
        """Waits for a round still in flight (training ended between two rounds), then
        lets the private gloo group go.

        Training ended normally, so every rank has joined every round it started and
        nothing is pending. Left alive, the group's gloo threads would be torn down with
        the interpreter, which can abort a finished process (see
        :func:`~lightning_srifty.capture.ddp.release_gloo_group_at_exit`); under an NCCL
        default group nothing else would destroy it.
        """
        if self._work is not None:
            self._work.wait()
            self._work = None
        if self._group is not None:
            import torch.distributed as dist

            if dist.is_initialized():  # the script may have destroyed every group already
                dist.destroy_process_group(self._group)
            self._group = None


def finish_preempted(state_dir: Path | None) -> int:
    """Leaves the preempted marker for the launcher; returns the exit code to use."""
    if state_dir is not None:
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            (state_dir / proto.PREEMPTED_MARKER).touch()
        except OSError as exc:
            log.warning("cannot write the preemption marker in %s: %s", state_dir, exc)
    return proto.PREEMPTED_EXIT_CODE
